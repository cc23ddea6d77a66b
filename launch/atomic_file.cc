#include "launch/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "launch/check.h"

namespace rl {

std::string ErrnoText() { return std::strerror(errno); }

std::string ParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool PathExists(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0) return true;
  if (errno == ENOENT) return false;
  throw CheckpointError(fmt::format("{}: cannot stat: {}", path, ErrnoText()));
}

void MakeDirectories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw CheckpointError(
          fmt::format("{}: cannot create the directory: {}", prefix, ErrnoText()));
    }
    if (slash == std::string::npos) break;
  }
  struct stat status {};
  if (::stat(dir.c_str(), &status) != 0 || !S_ISDIR(status.st_mode)) {
    throw CheckpointError(fmt::format("{}: not a directory", dir));
  }
}

void FsyncDirectory(const std::string& dir) {
  const FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || ::fsync(dir_fd.get()) != 0) {
    throw CheckpointError(fmt::format("{}: cannot fsync the directory: {}", dir, ErrnoText()));
  }
}

void RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw CheckpointError(fmt::format("{}: cannot rename {} to it: {}", to, from, ErrnoText()));
  }
  FsyncDirectory(ParentDirectory(to));
}

bool ExchangePaths(const std::string& a, const std::string& b) {
  // glibc 2.28 and later declare renameat2 and RENAME_EXCHANGE in <stdio.h> (_GNU_SOURCE, which
  // g++ defines); Linux has had it since 3.15.
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
    throw CheckpointError(fmt::format("{}: cannot exchange it with {}: {}", b, a, ErrnoText()));
  }
  FsyncDirectory(ParentDirectory(b));
  if (ParentDirectory(a) != ParentDirectory(b)) FsyncDirectory(ParentDirectory(a));
  return true;
}

void RemoveTree(const std::string& path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) {
    if (errno == ENOENT) return;
    throw CheckpointError(fmt::format("{}: cannot stat: {}", path, ErrnoText()));
  }
  if (S_ISDIR(status.st_mode)) {
    std::vector<std::string> children;
    {
      DIR* dir = ::opendir(path.c_str());
      if (dir == nullptr) {
        throw CheckpointError(fmt::format("{}: cannot list: {}", path, ErrnoText()));
      }
      while (const dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") children.push_back(JoinPath(path, name));
      }
      ::closedir(dir);
    }
    for (const std::string& child : children) RemoveTree(child);
    if (::rmdir(path.c_str()) != 0) {
      throw CheckpointError(fmt::format("{}: cannot remove the directory: {}", path, ErrnoText()));
    }
  } else if (::unlink(path.c_str()) != 0) {
    throw CheckpointError(fmt::format("{}: cannot remove: {}", path, ErrnoText()));
  }
}

namespace {

void ListFilesUnder(const std::string& root, const std::string& relative,
                    std::vector<std::string>& out) {
  const std::string dir_path = relative.empty() ? root : JoinPath(root, relative);
  DIR* dir = ::opendir(dir_path.c_str());
  if (dir == nullptr) {
    throw CheckpointError(fmt::format("{}: cannot list: {}", dir_path, ErrnoText()));
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  for (const std::string& name : names) {
    const std::string child = relative.empty() ? name : JoinPath(relative, name);
    struct stat status {};
    if (::stat(JoinPath(root, child).c_str(), &status) != 0) {
      throw CheckpointError(fmt::format("{}: cannot stat: {}", JoinPath(root, child), ErrnoText()));
    }
    if (S_ISDIR(status.st_mode)) {
      ListFilesUnder(root, child, out);
    } else if (S_ISREG(status.st_mode)) {
      out.push_back(child);
    }
  }
}

}  // namespace

std::vector<std::string> ListFiles(const std::string& dir) {
  std::vector<std::string> out;
  ListFilesUnder(dir, "", out);
  std::sort(out.begin(), out.end());
  return out;
}

std::string ReadWholeFile(const std::string& path) {
  const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", path, ErrnoText()));
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw CheckpointError(fmt::format("{}: cannot read: {}", path, ErrnoText()));
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

void WriteFileAtomically(const std::string& path, std::string_view text) {
  AtomicFileWriter writer(path);
  writer.Write(text);
  writer.Commit();
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

int FileDescriptor::Close() {
  const int fd = fd_;
  fd_ = -1;
  return ::close(fd);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)),
      temp_path_(fmt::format("{}.tmp.{}", path_, ::getpid())),
      fd_(::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
  if (fd_.get() < 0) {
    throw CheckpointError(fmt::format("{}: cannot create: {}", temp_path_, ErrnoText()));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::Write(const void* data, size_t num_bytes) {
  const char* p = static_cast<const char*>(data);
  while (num_bytes > 0) {
    // One write() moves at most about 2 GiB on Linux; ask for 1 GiB at a time.
    const ssize_t written = ::write(fd_.get(), p, std::min(num_bytes, size_t{1} << 30));
    if (written < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(fmt::format("{}: cannot write: {}", temp_path_, ErrnoText()));
    }
    p += written;
    num_bytes -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::Commit() {
  if (::fsync(fd_.get()) != 0) {
    throw CheckpointError(fmt::format("{}: cannot fsync: {}", temp_path_, ErrnoText()));
  }
  if (fd_.Close() != 0) {
    throw CheckpointError(fmt::format("{}: cannot close: {}", temp_path_, ErrnoText()));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw CheckpointError(
        fmt::format("{}: cannot rename {} into place: {}", path_, temp_path_, ErrnoText()));
  }
  committed_ = true;
  FsyncDirectory(ParentDirectory(path_));
}

}  // namespace rl
