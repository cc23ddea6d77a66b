// Atomic replacement of a file, the POSIX file-descriptor owner it is built on, and the few path
// operations checkpoints need (mkdir -p, rename, remove a tree, list files, fsync a directory).
// Checkpoint shards, their index, manifests and rollout data are all written through
// AtomicFileWriter.
//
// Crash guarantee: AtomicFileWriter writes `<path>.tmp.<pid>` and, on Commit(), fsyncs it,
// renames it over `path` and fsyncs the parent directory. After a crash at any point `path` is
// either the old file (or absent, if there was none) or the complete new one, never a prefix.
// A crash before Commit() can leave the temporary file behind; the pid in its name keeps two
// processes writing the same path from clobbering each other's temporary file.
// Ownership: FileDescriptor owns one descriptor and closes it in its destructor. AtomicFileWriter
// owns its temporary file: destroyed without a successful rename in Commit() (an exception
// unwinding the writer), it unlinks the temporary file. Neither is copyable or movable.
// Thread safety: one writer per thread; the free functions are stateless.
// Failures: every failure throws rl::CheckpointError naming the file (the temporary file for
// create/write/fsync/close, the final path for rename, the directory for its fsync) and the
// errno text. Destructors never throw.
//
// Paths are handled with POSIX calls, not std::filesystem: libtorch.so exports its own copies of
// the std::filesystem functions, built against another libstdc++, and those win at load time and
// crash (seen with torch 2.11 and GCC 12: remove_all jumps to address 0).
#ifndef RL_LAUNCH_ATOMIC_FILE_H_
#define RL_LAUNCH_ATOMIC_FILE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace rl {

// strerror(errno), for messages; call it before anything else can change errno.
std::string ErrnoText();

// "/a/b/c.jsonl" -> "/a/b"; "/c" -> "/"; "c.jsonl" -> ".".
std::string ParentDirectory(const std::string& path);
// "dir" + "name" with one '/' between them; `name` alone when `dir` is empty.
std::string JoinPath(const std::string& dir, const std::string& name);

// False when nothing is at `path`; throws CheckpointError when it cannot be told (permissions).
bool PathExists(const std::string& path);
// mkdir -p; throws CheckpointError when a component cannot be created or is not a directory.
void MakeDirectories(const std::string& dir);
// rename(2), then fsync of the destination's directory.
void RenamePath(const std::string& from, const std::string& to);
// Swaps `a` and `b` (files or directories, both present) in one step: renameat2(2) with
// RENAME_EXCHANGE, then fsync of their directory (or directories). After a crash each name holds
// one of the two, never nothing. Returns false, changing nothing, where the file system or the
// kernel cannot exchange (EINVAL, ENOSYS, ENOTSUP: some network and FUSE file systems); throws
// CheckpointError naming both on any other failure.
bool ExchangePaths(const std::string& a, const std::string& b);
// rm -r: removes `path` (a file or a directory tree); nothing when it does not exist.
void RemoveTree(const std::string& path);
// The regular files under `dir`, recursively, as paths relative to `dir`, sorted.
std::vector<std::string> ListFiles(const std::string& dir);
void FsyncDirectory(const std::string& dir);
// The whole file; throws CheckpointError naming it when it cannot be read.
std::string ReadWholeFile(const std::string& path);
// Writes `text` to `path` through an AtomicFileWriter (temporary file, fsync, rename).
void WriteFileAtomically(const std::string& path, std::string_view text);

// Owns a POSIX file descriptor; a negative value means none.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  // Closes now and returns close()'s result, which can carry a delayed write error.
  int Close();

 private:
  int fd_;
};

// Writes `path` under a temporary name, `<path>.tmp.<pid>`, and moves it into place on Commit().
// See the contract at the top of this file.
class AtomicFileWriter {
 public:
  // Creates (truncates) the temporary file, mode 0644. The directory of `path` must exist.
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends bytes to the temporary file, retrying short writes and EINTR.
  void Write(const void* data, size_t num_bytes);
  void Write(std::string_view bytes) { Write(bytes.data(), bytes.size()); }

  // fsync, close, rename over `path`, fsync of the directory. Call once, after the last Write().
  // If only the directory fsync fails, `path` already holds the new file and the writer counts
  // as committed (the temporary file is gone).
  void Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  std::string path_;
  std::string temp_path_;
  FileDescriptor fd_;
  bool committed_ = false;
};

}  // namespace rl

#endif  // RL_LAUNCH_ATOMIC_FILE_H_
