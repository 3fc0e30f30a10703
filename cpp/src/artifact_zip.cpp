// cpp/src/artifact_zip.cpp: the .honed zip: mapped, verified reading and atomic writing (libzip).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "honed/artifact.h"
#include "honed/digest.h"

namespace honed {

// The whole file mapped read-only: entries are views into it, never copies.
class MappedFile {
 public:
  MappedFile(const void* data, size_t size) : data_(data), size_(size) {}
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<void*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  const void* data_;
  size_t size_;
};

namespace {

using json = nlohmann::json;

std::string named(const std::string& s) { return "'" + s + "'"; }

std::string unreadable(const std::string& path, const std::string& why) {
  return path + " is not a readable honed artifact (truncated or not a zip: " + why + ")";
}

std::shared_ptr<const MappedFile> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) throw ArtifactError(path + " does not exist");
    throw ArtifactError(path + " cannot be read (" + std::strerror(err) +
                        "): check its permissions");
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ArtifactError(path + " is not a file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    throw ArtifactError(unreadable(path, "the file is empty"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (data == MAP_FAILED) {
    throw ArtifactError(path + " cannot be read (mmap: " + std::strerror(err) + ")");
  }
  return std::make_shared<const MappedFile>(data, size);
}

uint64_t le(std::string_view b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<size_t>(i)]);
  }
  return v;
}

// One central directory record: the entry's name and where its local header starts.
struct CdEntry {
  std::string name;
  uint64_t offset = 0;  // of its local header
  uint64_t size = 0;    // uncompressed
  uint64_t stored = 0;  // compressed (== size for stored entries)
};

// The central directory, in index order: read before libzip opens the archive, so that names
// are judged (and named in messages) first; libzip then checks the archive's consistency, and
// the offsets say where each entry's bytes start, for the views.
std::vector<CdEntry> central_directory(std::string_view b, const std::string& path) {
  auto fail = [&](const char* why) -> std::vector<CdEntry> {
    throw ArtifactError(unreadable(path, why));
  };
  if (b.size() < 22) return fail("shorter than a zip end record");
  size_t eocd = std::string_view::npos;
  const size_t lowest = b.size() > 22 + 65535 ? b.size() - 22 - 65535 : 0;
  for (size_t at = b.size() - 22;; --at) {
    if (le(b, at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == lowest) break;
  }
  if (eocd == std::string_view::npos) return fail("no end of central directory");
  uint64_t count = le(b, eocd + 10, 2), cd = le(b, eocd + 16, 4);
  if (count == 0xFFFF || cd == 0xFFFFFFFF) {
    if (eocd < 20 || le(b, eocd - 20, 4) != 0x07064b50) return fail("no zip64 end locator");
    uint64_t z64 = le(b, eocd - 20 + 8, 8);
    if (z64 + 56 > b.size() || le(b, z64, 4) != 0x06064b50) return fail("bad zip64 end record");
    count = le(b, z64 + 32, 8);
    cd = le(b, z64 + 48, 8);
  }
  std::vector<CdEntry> out;
  uint64_t at = cd;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > b.size() || le(b, at, 4) != 0x02014b50) return fail("bad central directory");
    const uint64_t name = le(b, at + 28, 2), extra = le(b, at + 30, 2), comment = le(b, at + 32, 2);
    if (at + 46 + name + extra + comment > b.size()) return fail("central directory past the end");
    // Sizes and offset; those written as 0xFFFFFFFF are in the zip64 extra field, in this order.
    uint64_t fields[3] = {le(b, at + 24, 4), le(b, at + 20, 4), le(b, at + 42, 4)};
    if (fields[0] == 0xFFFFFFFF || fields[1] == 0xFFFFFFFF || fields[2] == 0xFFFFFFFF) {
      bool found = false;
      for (uint64_t e = at + 46 + name; e + 4 <= at + 46 + name + extra && !found;) {
        const uint64_t id = le(b, e, 2), len = le(b, e + 2, 2);
        if (id == 1 && e + 4 + len <= b.size()) {
          found = true;
          uint64_t next = e + 4;
          for (uint64_t& f : fields) {
            if (f != 0xFFFFFFFF) continue;
            if (next + 8 > e + 4 + len) return fail("zip64 field shorter than its sizes");
            f = le(b, next, 8);
            next += 8;
          }
        }
        e += 4 + len;
      }
      if (!found) return fail("zip64 entry without its zip64 field");
    }
    out.push_back(CdEntry{std::string(b.substr(at + 46, name)), fields[2], fields[0], fields[1]});
    at += 46 + name + extra + comment;
  }
  return out;
}

struct ZipDiscard {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct FileClose {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

// One entry as the central directory describes it, and where its bytes are in the mapping.
struct ZipEntry {
  zip_uint64_t index = 0;
  std::string name;
  std::string_view view;
};

// Calls job(0) .. job(n - 1) on up to one thread per core, the calling one included; rethrows
// the first exception a job threw once all have stopped.
template <typename Job>
void in_parallel(size_t n, const Job& job) {
  const size_t threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::mutex failed_lock;
  std::exception_ptr failed;
  auto work = [&] {
    try {
      for (size_t i = next++; i < n; i = next++) job(i);
    } catch (...) {
      std::lock_guard<std::mutex> hold(failed_lock);
      if (!failed) failed = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& h : helpers) h.join();
  if (failed) std::rethrow_exception(failed);
}

// Streams an entry through libzip to its end (libzip checks the CRC-32 there), hashing it and
// comparing it with its view, in a fixed-size buffer. Returns the SHA-256 hex.
std::string verify_entry(zip_t* z, const ZipEntry& e, const std::string& path) {
  std::unique_ptr<zip_file_t, FileClose> f(zip_fopen_index(z, e.index, 0));
  if (!f) {
    throw ArtifactError(
        unreadable(path, "cannot open entry " + named(e.name) + ": " + zip_strerror(z)));
  }
  Sha256 hash;
  std::vector<char> buffer(std::min<size_t>(e.view.size() + 1, 1 << 20));
  size_t done = 0;
  for (;;) {
    zip_int64_t n = zip_fread(f.get(), buffer.data(), buffer.size());
    if (n < 0) {
      throw ArtifactError("entry " + named(e.name) + " of " + path + " is damaged (" +
                          zip_file_strerror(f.get()) +
                          "): the file was modified or truncated; re-save it from the tuned model");
    }
    if (n == 0) break;
    const size_t got = static_cast<size_t>(n);
    if (done + got > e.view.size() || std::memcmp(buffer.data(), e.view.data() + done, got) != 0) {
      throw ArtifactError(unreadable(path, "entry " + named(e.name) +
                                               " is not where the "
                                               "central directory says"));
    }
    hash.update(buffer.data(), got);
    done += got;
  }
  if (done != e.view.size()) {
    throw ArtifactError(unreadable(path, "entry " + named(e.name) + " is shorter than declared"));
  }
  return hash.hexdigest();
}

bool unsafe_name(const std::string& name) {
  if (name.empty() || name[0] == '/' || name.find('\\') != std::string::npos) return true;
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    std::string_view part(name.data() + start,
                          (slash == std::string::npos ? name.size() : slash) - start);
    if (part == ".." || part == "." || part.empty()) return true;
    if (slash == std::string::npos) return false;
    start = slash + 1;
  }
}

// Refuses names honed never writes and sizes larger than the file, naming the entry, before
// libzip (which refuses some of these without saying which entry) opens the archive.
void check_entries(const std::vector<CdEntry>& cd, uint64_t file_size, const std::string& path) {
  std::set<std::string> seen;
  for (const CdEntry& e : cd) {
    if (unsafe_name(e.name)) {
      throw ArtifactError(path + " has an entry named " + named(e.name) +
                          ", which honed never writes (absolute or with '..'); refused");
    }
    if (!seen.insert(e.name).second) {
      throw ArtifactError(path + " holds entry " + named(e.name) +
                          " twice, which honed never writes; refused");
    }
    if (std::max(e.size, e.stored) > file_size) {
      throw ArtifactError(path + ": entry " + named(e.name) + " declares " +
                          std::to_string(std::max(e.size, e.stored)) +
                          " bytes, more than the file's " + std::to_string(file_size) +
                          "; the file is truncated or crafted");
    }
  }
}

// Every entry of the archive, checked before any is read: storage method and sizes.
std::map<std::string, ZipEntry> index_entries(zip_t* z, std::string_view file,
                                              const std::vector<CdEntry>& cd,
                                              const std::string& path) {
  const zip_int64_t count = zip_get_num_entries(z, 0);
  if (cd.size() != static_cast<size_t>(count)) {
    throw ArtifactError(unreadable(path, "central directory entry count"));
  }
  std::map<std::string, ZipEntry> out;
  for (zip_int64_t i = 0; i < count; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW, &st) != 0) {
      throw ArtifactError(unreadable(path, zip_strerror(z)));
    }
    std::string name = st.name;
    if (name != cd[static_cast<size_t>(i)].name) {
      throw ArtifactError(unreadable(path, "entry names disagree with the central directory"));
    }
    if (st.comp_method != ZIP_CM_STORE || st.comp_size != st.size) {
      throw ArtifactError(path + ": entry " + named(name) +
                          " is compressed; honed stores entries uncompressed: re-save it");
    }
    const uint64_t lho = cd[static_cast<size_t>(i)].offset;
    if (st.size > file.size() || lho + 30 > file.size() || le(file, lho, 4) != 0x04034b50) {
      throw ArtifactError(path + ": entry " + named(name) + " declares " + std::to_string(st.size) +
                          " bytes, more than the file's " + std::to_string(file.size()) +
                          "; the file is truncated or crafted");
    }
    const uint64_t data = lho + 30 + le(file, lho + 26, 2) + le(file, lho + 28, 2);
    if (data > file.size() || st.size > file.size() - data) {
      throw ArtifactError(path + ": entry " + named(name) + " declares " + std::to_string(st.size) +
                          " bytes, which run past the end of the " + std::to_string(file.size()) +
                          "-byte file; it is truncated or crafted");
    }
    out.emplace(name, ZipEntry{static_cast<zip_uint64_t>(i), name,
                               file.substr(static_cast<size_t>(data), st.size)});
  }
  return out;
}

ArtifactSignature parse_signature(std::string_view text, const std::string& path) {
  try {
    json s = json::parse(text);
    if (s.value("algorithm", "") != "ed25519") {
      throw ArtifactError(path + ": " + kSignatureEntry + " uses algorithm " +
                          s.value("algorithm", json("none")).dump() + "; honed signs with ed25519");
    }
    std::string hex = s.at("signature").get<std::string>();
    std::string raw;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      raw += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    }
    return ArtifactSignature{s.at("public_key").get<std::string>(), raw};
  } catch (const ArtifactError&) {
    throw;
  } catch (const std::exception& e) {
    throw ArtifactError(path + ": " + kSignatureEntry + " is malformed (" + e.what() +
                        "); re-save the artifact");
  }
}

}  // namespace

std::string_view Artifact::entry(const std::string& name) const {
  auto it = views.find(name);
  if (it == views.end()) {
    throw ArtifactError(path + ": the manifest names entry " + named(name) +
                        ", which it does not list; the file is crafted or damaged: re-save it");
  }
  return it->second;
}

std::string_view Artifact::bytes() const { return file ? file->bytes() : std::string_view(); }

Artifact read_artifact(const std::string& path) {
  Artifact a;
  a.path = path;
  a.file = map_file(path);
  const std::string_view bytes = a.file->bytes();
  const std::vector<CdEntry> cd = central_directory(bytes, path);
  check_entries(cd, bytes.size(), path);
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* source = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &error);
  zip_t* opened =
      source ? zip_open_from_source(source, ZIP_RDONLY | ZIP_CHECKCONS, &error) : nullptr;
  if (opened == nullptr) {
    if (source != nullptr) zip_source_free(source);
    std::string why = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw ArtifactError(unreadable(path, why));
  }
  std::unique_ptr<zip_t, ZipDiscard> z(opened);
  std::map<std::string, ZipEntry> entries = index_entries(z.get(), bytes, cd, path);

  auto small = [&](const char* name) -> std::string_view {
    const ZipEntry& e = entries.at(name);
    if (e.view.size() > kMaxManifestBytes) {
      throw ArtifactError(path + ": entry " + named(name) + " is " + std::to_string(e.view.size()) +
                          " bytes, more than a manifest can be (" +
                          std::to_string(kMaxManifestBytes) + "); the file is crafted");
    }
    verify_entry(z.get(), e, path);  // CRC-32
    return e.view;
  };
  if (!entries.count(kManifestEntry)) {
    throw ArtifactError(path + " is not a honed artifact (no " + kManifestEntry + ", " +
                        std::to_string(entries.size()) + " entries)");
  }
  a.manifest_json = std::string(small(kManifestEntry));
  a.manifest = manifest_from_json(a.manifest_json, path);
  if (entries.count(kSignatureEntry)) {
    a.signature = parse_signature(small(kSignatureEntry), path);
  }
  for (const auto& [name, e] : entries) {
    if (name != kManifestEntry && name != kSignatureEntry && !a.manifest.entries.count(name)) {
      throw ArtifactError(path + " holds entry " + named(name) +
                          ", which its manifest does not list; the file is crafted: re-save it");
    }
  }
  // Each listed entry's SHA-256, over its bytes where they lie in the mapping (index_entries
  // placed every stored entry): one pass over the file instead of libzip's copy. A large entry is
  // checked piece by piece against entry_chunks, so that the weights are not hashed on one core.
  // Only an entry whose hash differs is read again through libzip, whose CRC-32 then says whether
  // the file was damaged or rewritten.
  struct Check {
    size_t entry;            // index into listed
    std::string_view bytes;  // the whole entry or one piece of it
    const std::string* digest;
  };
  std::vector<const ZipEntry*> listed;
  std::vector<Check> checks;
  for (const auto& [name, digest] : a.manifest.entries) {
    auto it = entries.find(name);
    if (it == entries.end()) {
      throw ArtifactError(path + " is missing entry " + named(name) +
                          "; the file is incomplete: re-save it from the tuned model");
    }
    const std::string_view view = it->second.view;
    auto pieces = a.manifest.entry_chunks.find(name);
    if (pieces == a.manifest.entry_chunks.end()) {
      checks.push_back({listed.size(), view, &digest});
    } else {
      const size_t count = (view.size() + kEntryChunkBytes - 1) / kEntryChunkBytes;
      if (pieces->second.size() != count) {
        verify_entry(z.get(), it->second, path);
        throw ArtifactError("entry " + named(name) + " of " + path + " is " +
                            std::to_string(view.size()) + " bytes, which its manifest's " +
                            std::to_string(pieces->second.size()) +
                            " piece digests do not cover: the file was modified or damaged; "
                            "re-save it from the tuned model");
      }
      for (size_t k = 0; k < count; ++k) {
        checks.push_back({listed.size(), view.substr(k * kEntryChunkBytes, kEntryChunkBytes),
                          &pieces->second[k]});
      }
    }
    listed.push_back(&it->second);
  }
  std::vector<char> matches(checks.size(), 0);
  in_parallel(checks.size(),
              [&](size_t i) { matches[i] = sha256_hex(checks[i].bytes) == *checks[i].digest; });
  std::vector<char> entry_ok(listed.size(), 1);
  for (size_t i = 0; i < checks.size(); ++i) entry_ok[checks[i].entry] &= matches[i];
  for (size_t i = 0; i < listed.size(); ++i) {
    const ZipEntry& e = *listed[i];
    if (!entry_ok[i]) {
      verify_entry(z.get(), e, path);  // CRC-32: throws when the bytes were damaged
      throw ArtifactError("entry " + named(e.name) + " of " + path +
                          " does not match its SHA-256: the file was modified or damaged; "
                          "re-save it from the tuned model");
    }
    a.views.emplace(e.name, e.view);
  }
  return a;
}

// ---- writing -----------------------------------------------------------------------------------

namespace {

// A new file beside `path`, created with O_EXCL and mode 0666 (the umask applies, as for any file
// the user creates); returns its name.
std::string create_beside(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string tmp = dir + "." + base + "." + std::to_string(random()) + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      return tmp;
    }
    if (errno != EEXIST) {
      throw ArtifactError("cannot write " + path + " (" + std::strerror(errno) +
                          "): check that its folder exists and is writable");
    }
  }
  throw ArtifactError("cannot create a temporary file beside " + path);
}

std::string to_hex(std::string_view raw) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += hex[c >> 4];
    out += hex[c & 0xf];
  }
  return out;
}

void add_stored(zip_t* z, const std::string& name, std::string_view data, const std::string& path) {
  zip_source_t* src = zip_source_buffer(z, data.data(), data.size(), 0);
  zip_int64_t index = src ? zip_file_add(z, name.c_str(), src, ZIP_FL_ENC_UTF_8) : -1;
  if (index < 0) {
    if (src != nullptr) zip_source_free(src);
    throw ArtifactError("cannot write " + path + ": entry " + named(name) + ": " + zip_strerror(z));
  }
  zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
}

}  // namespace

Manifest write_artifact(const std::string& path, Manifest manifest,
                        const std::vector<EntryData>& entries, const std::string& signing_key_pem) {
  manifest.entries.clear();
  manifest.entry_chunks.clear();
  // Jobs: every entry whole (what readers before entry_chunks check), and each piece of those
  // longer than one, hashed side by side.
  struct Job {
    const EntryData* entry;
    std::string_view bytes;
    std::string* digest;
  };
  std::set<std::string> names;
  std::vector<std::string> whole(entries.size());
  std::vector<Job> jobs;
  for (size_t i = 0; i < entries.size(); ++i) {
    const EntryData& e = entries[i];
    if (unsafe_name(e.name) || e.name == kManifestEntry || e.name == kSignatureEntry) {
      throw ArtifactError("write_artifact: entry name " + named(e.name) + " is not allowed");
    }
    if (!names.insert(e.name).second) {
      throw ArtifactError("write_artifact: entry " + named(e.name) + " is given twice");
    }
    jobs.push_back({&e, e.data, &whole[i]});
  }
  for (const EntryData& e : entries) {
    if (e.data.size() <= kEntryChunkBytes) continue;
    std::vector<std::string>& pieces = manifest.entry_chunks[e.name];
    pieces.resize((e.data.size() + kEntryChunkBytes - 1) / kEntryChunkBytes);
    for (size_t k = 0; k < pieces.size(); ++k) {
      jobs.push_back({&e, e.data.substr(k * kEntryChunkBytes, kEntryChunkBytes), &pieces[k]});
    }
  }
  in_parallel(jobs.size(), [&](size_t i) { *jobs[i].digest = sha256_hex(jobs[i].bytes); });
  for (size_t i = 0; i < entries.size(); ++i) manifest.entries.emplace(entries[i].name, whole[i]);
  const std::string manifest_json = manifest_to_json(manifest);
  std::string signature_json;
  if (!signing_key_pem.empty()) {
    json sig = {{"algorithm", "ed25519"},
                {"public_key", public_key_of(signing_key_pem)},
                {"signature", to_hex(sign(signing_key_pem, manifest_json))}};
    signature_json = sig.dump(2);
  }
  const std::string tmp = create_beside(path);
  int err = 0;
  zip_t* z = zip_open(tmp.c_str(), ZIP_TRUNCATE, &err);
  if (z == nullptr) {
    ::unlink(tmp.c_str());
    throw ArtifactError("cannot write " + path + " (libzip error " + std::to_string(err) + ")");
  }
  try {
    add_stored(z, kManifestEntry, manifest_json, path);
    if (!signature_json.empty()) add_stored(z, kSignatureEntry, signature_json, path);
    for (const EntryData& e : entries) add_stored(z, e.name, e.data, path);
  } catch (...) {
    zip_discard(z);
    ::unlink(tmp.c_str());
    throw;
  }
  if (zip_close(z) != 0) {
    std::string why = zip_strerror(z);
    zip_discard(z);
    ::unlink(tmp.c_str());
    throw ArtifactError("cannot write " + path + ": " + why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw ArtifactError("cannot write " + path + " (" + std::strerror(e) + ")");
  }
  return manifest;
}

}  // namespace honed
