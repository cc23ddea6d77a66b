// The checkpoint manifest and the `latest` pointer: a checkpoint is found only through a complete
// manifest, and every malformed line or pointer is refused naming the file and the line.
#include "trainer/checkpoint.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "launch/atomic_file.h"
#include "launch/check.h"

namespace rl {
namespace {

std::string MakeTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/checkpoint.XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

void Write(const std::string& path, const std::string& text) {
  MakeDirectories(ParentDirectory(path));
  AtomicFileWriter writer(path);
  writer.Write(text);
  writer.Commit();
}

const std::string kDigest(64, 'a');

TEST_CASE("a manifest in sha256sum format reads back as path -> digest") {
  const std::string dir = MakeTempDir();
  Write(dir + "/manifest.sha256", kDigest + "  config.json\n" + std::string(64, '0') +
                                      "  optimizer/rank_00000.safetensors\n");
  const auto manifest = ReadManifest(dir);
  REQUIRE(manifest.size() == 2);
  CHECK(manifest.at("config.json") == kDigest);
  CHECK(manifest.at("optimizer/rank_00000.safetensors") == std::string(64, '0'));
}

TEST_CASE("a malformed manifest line is refused with its number") {
  const std::string dir = MakeTempDir();
  const std::string bad_lines[] = {
      "ABC  config.json",                  // not 64 lowercase hex digits
      kDigest + " config.json",            // one space
      kDigest + "  /etc/passwd",           // absolute path
      kDigest + "  ../outside",            // escapes the directory
      kDigest + "  manifest.sha256",       // lists itself
  };
  for (const std::string& bad : bad_lines) {
    CAPTURE(bad);
    Write(dir + "/manifest.sha256", kDigest + "  config.json\n" + bad + "\n");
    CHECK_THROWS_AS(ReadManifest(dir), CheckpointError);
    CHECK_THROWS_WITH(ReadManifest(dir), Catch::Contains(dir + "/manifest.sha256: line 2"));
  }
  Write(dir + "/manifest.sha256", kDigest + "  a\n" + kDigest + "  a\n");
  CHECK_THROWS_WITH(ReadManifest(dir), Catch::Contains("line 2: a is listed twice"));
  Write(dir + "/manifest.sha256", "");
  CHECK_THROWS_WITH(ReadManifest(dir), Catch::Contains("manifest.sha256: empty"));
}

TEST_CASE("a checkpoint is found through its manifest or through `latest`, nothing else") {
  const std::string root = MakeTempDir();
  const std::string dir = root + "/iter_0000002";
  Write(dir + "/manifest.sha256", kDigest + "  config.json\n");
  CHECK(ResolveCheckpointDir(dir) == dir);
  // No `latest` yet: the root is not a checkpoint.
  CHECK_THROWS_AS(ResolveCheckpointDir(root), CheckpointError);
  CHECK_THROWS_WITH(ResolveCheckpointDir(root), Catch::Contains(root + ": not a checkpoint"));
  Write(root + "/latest", "iter_0000002\n");
  CHECK(ResolveCheckpointDir(root) == dir);
  Write(root + "/latest", "../elsewhere\n");
  CHECK_THROWS_WITH(ResolveCheckpointDir(root),
                    Catch::Contains("latest: expected one line 'iter_NNNNNNN'"));
  // `latest` naming a directory whose save did not finish (no manifest).
  Write(root + "/iter_0000003/config.json", "{}");
  Write(root + "/latest", "iter_0000003\n");
  CHECK_THROWS_WITH(ResolveCheckpointDir(root), Catch::Contains("which has no manifest.sha256"));
}

// Note [Re-saving]: without RENAME_EXCHANGE a re-save renames the old directory to .old, then
// the new one in; a crash between the two leaves `latest` naming a directory that is missing or
// (a later save's leftover) has no manifest, and the earlier save under .old is what loads.
TEST_CASE("`latest` naming a re-save cut short between its renames loads the earlier save") {
  const std::string root = MakeTempDir();
  Write(root + "/iter_0000002.old/manifest.sha256", kDigest + "  config.json\n");
  Write(root + "/latest", "iter_0000002\n");
  CHECK(ResolveCheckpointDir(root) == root + "/iter_0000002.old");
  Write(root + "/iter_0000002/config.json", "{}");
  CHECK(ResolveCheckpointDir(root) == root + "/iter_0000002.old");
  // Once the new directory is complete, it is the one.
  Write(root + "/iter_0000002/manifest.sha256", kDigest + "  config.json\n");
  CHECK(ResolveCheckpointDir(root) == root + "/iter_0000002");
}

}  // namespace
}  // namespace rl
