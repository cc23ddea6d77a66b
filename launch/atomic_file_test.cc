// AtomicFileWriter: a committed write reads back byte for byte, an uncommitted one leaves
// nothing behind, and a failure names the file.
#include "launch/atomic_file.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "launch/check.h"

namespace rl {
namespace {

// A fresh directory for one test, under Bazel's TEST_TMPDIR when there is one.
std::string MakeTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/atomic_file.XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

TEST_CASE("a committed write reads back with the exact bytes, through both overloads") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/data.bin";
  // Embedded NUL and high bytes: nothing may treat this as a C string.
  const std::string first("ab\0c\xff", 5);
  const unsigned char second[] = {0x00, 0x01, 0x80, 0xfe};
  {
    AtomicFileWriter writer(path);
    writer.Write(first);
    writer.Write(second, sizeof(second));
    writer.Write(std::string_view());
    writer.Commit();
  }
  const std::string expected = first + std::string(reinterpret_cast<const char*>(second), 4);
  CHECK(ReadWholeFile(path) == expected);
  CHECK(ListFiles(dir) == std::vector<std::string>{"data.bin"});
}

TEST_CASE("a commit replaces an existing file") {
  const std::string path = MakeTempDir() + "/data.txt";
  for (const std::string text : {"old contents, longer", "new"}) {
    AtomicFileWriter writer(path);
    writer.Write(text);
    writer.Commit();
  }
  CHECK(ReadWholeFile(path) == "new");
}

TEST_CASE("a writer destroyed without Commit leaves neither the file nor its temp file") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/data.txt";
  {
    AtomicFileWriter writer(path);
    writer.Write("partial");
    CHECK(PathExists(writer.temp_path()));
  }
  CHECK_FALSE(PathExists(path));
  CHECK(ListFiles(dir).empty());
}

TEST_CASE("an uncommitted writer leaves the old file as it was") {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/data.txt";
  {
    AtomicFileWriter writer(path);
    writer.Write("old");
    writer.Commit();
  }
  {
    AtomicFileWriter writer(path);
    writer.Write("new, never committed");
  }
  CHECK(ReadWholeFile(path) == "old");
  CHECK(ListFiles(dir) == std::vector<std::string>{"data.txt"});
}

TEST_CASE("a write into a missing directory throws CheckpointError naming the path") {
  const std::string path = MakeTempDir() + "/missing/data.txt";
  try {
    AtomicFileWriter writer(path);
    FAIL("expected CheckpointError");
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find("No such file or directory") != std::string::npos);
  }
}

TEST_CASE("MakeDirectories, ListFiles and RemoveTree work on a nested tree") {
  const std::string dir = MakeTempDir() + "/ckpt";
  MakeDirectories(dir + "/optimizer/deep");
  MakeDirectories(dir + "/optimizer");  // existing: no error
  for (const std::string name : {"b.json", "a.safetensors", "optimizer/rank_00001.safetensors",
                                 "optimizer/deep/x"}) {
    AtomicFileWriter writer(JoinPath(dir, name));
    writer.Write(name);
    writer.Commit();
  }
  CHECK(ListFiles(dir) == std::vector<std::string>{"a.safetensors", "b.json",
                                                   "optimizer/deep/x",
                                                   "optimizer/rank_00001.safetensors"});
  CHECK(ReadWholeFile(JoinPath(dir, "b.json")) == "b.json");
  RenamePath(dir, dir + ".moved");
  CHECK_FALSE(PathExists(dir));
  RemoveTree(dir + ".moved");
  CHECK_FALSE(PathExists(dir + ".moved"));
  RemoveTree(dir + ".moved");  // absent: nothing to do
}

TEST_CASE("MakeDirectories over a file and reading a missing file throw naming the path") {
  const std::string dir = MakeTempDir();
  {
    AtomicFileWriter writer(dir + "/file");
    writer.Commit();
  }
  CHECK_THROWS_WITH(MakeDirectories(dir + "/file"), Catch::Contains(dir + "/file"));
  CHECK_THROWS_WITH(ReadWholeFile(dir + "/missing"),
                    Catch::Contains(dir + "/missing: cannot open"));
}

TEST_CASE("ExchangePaths swaps two directories in one step, or says it cannot") {
  const std::string dir = MakeTempDir();
  MakeDirectories(dir + "/new");
  MakeDirectories(dir + "/old");
  WriteFileAtomically(dir + "/new/manifest", "new");
  WriteFileAtomically(dir + "/old/manifest", "old");
  if (!ExchangePaths(dir + "/new", dir + "/old")) {
    WARN("this file system cannot exchange paths (renameat2 RENAME_EXCHANGE); nothing changed");
    CHECK(ReadWholeFile(dir + "/new/manifest") == "new");
    return;
  }
  CHECK(ReadWholeFile(dir + "/old/manifest") == "new");
  CHECK(ReadWholeFile(dir + "/new/manifest") == "old");
  CHECK_THROWS_WITH(ExchangePaths(dir + "/new", dir + "/missing"),
                    Catch::Contains(dir + "/missing: cannot exchange it with " + dir + "/new"));
}

TEST_CASE("ParentDirectory") {
  CHECK(ParentDirectory("/a/b/c.jsonl") == "/a/b");
  CHECK(ParentDirectory("/c") == "/");
  CHECK(ParentDirectory("c.jsonl") == ".");
}

}  // namespace
}  // namespace rl
