#include "launch/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
  const std::string dir = ParentDirectory(path_);
  const FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || ::fsync(dir_fd.get()) != 0) {
    throw CheckpointError(
        fmt::format("{}: wrote {}, but cannot fsync its directory: {}", dir, path_, ErrnoText()));
  }
}

}  // namespace rl
