// cpp/src/artifact_sign.cpp: Ed25519 keys, signatures and the trusted key set (OpenSSL EVP).
#include <dirent.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "honed/artifact.h"

namespace honed {
namespace {

using PKey = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
using MdCtx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

Bio memory_bio(std::string_view text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
}

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  long len = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(len));
}

PKey ed25519(EVP_PKEY* key, const char* what) {
  PKey k(key, EVP_PKEY_free);
  if (!k || EVP_PKEY_id(k.get()) != EVP_PKEY_ED25519) {
    throw ArtifactError(std::string("not an Ed25519 ") + what +
                        " in PEM form (make one with `honed keygen`)");
  }
  return k;
}

PKey private_key(const std::string& pem) {
  Bio bio = memory_bio(pem);
  return ed25519(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr), "private key");
}

PKey public_key(const std::string& pem) {
  Bio bio = memory_bio(pem);
  return ed25519(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr), "public key");
}

std::string raw_public(EVP_PKEY* key) {
  unsigned char raw[32];
  size_t len = sizeof(raw);
  if (EVP_PKEY_get_raw_public_key(key, raw, &len) != 1) {
    throw ArtifactError("cannot read the raw Ed25519 public key");
  }
  return std::string(reinterpret_cast<const char*>(raw), len);
}

std::string public_pem(EVP_PKEY* key) {
  Bio out(BIO_new(BIO_s_mem()), BIO_free);
  if (!out || PEM_write_bio_PUBKEY(out.get(), key) != 1) {
    throw ArtifactError("OpenSSL could not write a public key");
  }
  return bio_text(out.get());
}

}  // namespace

SigningKey generate_signing_key() {
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), EVP_PKEY_CTX_free);
  EVP_PKEY* raw = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    throw ArtifactError("OpenSSL could not generate an Ed25519 key");
  }
  PKey key(raw, EVP_PKEY_free);
  Bio out(BIO_new(BIO_s_mem()), BIO_free);
  if (!out ||
      PEM_write_bio_PrivateKey(out.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    throw ArtifactError("OpenSSL could not write the private key");
  }
  return SigningKey{bio_text(out.get()), public_pem(key.get())};
}

std::string public_key_of(const std::string& private_pem) {
  return public_pem(private_key(private_pem).get());
}

std::string key_id(const std::string& pem) {
  return sha256_hex(raw_public(public_key(pem).get())).substr(0, 16);
}

std::string ArtifactSignature::key_id() const { return honed::key_id(public_key_pem); }

std::string sign(const std::string& private_pem, std::string_view data) {
  PKey key = private_key(private_pem);
  MdCtx ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  size_t len = 0;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &len, nullptr, 0) != 1) {
    throw ArtifactError("OpenSSL could not start an Ed25519 signature");
  }
  std::string out(len, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len,
                     reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1) {
    throw ArtifactError("OpenSSL could not sign");
  }
  out.resize(len);
  return out;
}

bool verify(const std::string& pem, std::string_view data, std::string_view signature) {
  PKey key = public_key(pem);
  MdCtx ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(data.data()),
                          data.size()) == 1;
}

TrustCheck check_trust(const Artifact& a, const std::vector<std::string>& trusted_public_pems) {
  if (!a.signature) return {Trust::kUnsigned, ""};
  std::string id, raw;
  try {
    PKey key = public_key(a.signature->public_key_pem);
    raw = raw_public(key.get());
    id = sha256_hex(raw).substr(0, 16);
    if (!verify(a.signature->public_key_pem, a.manifest_json, a.signature->signature)) {
      return {Trust::kBadSignature, id};
    }
  } catch (const ArtifactError&) {
    return {Trust::kBadSignature, id};
  }
  for (const std::string& pem : trusted_public_pems) {
    try {
      if (raw_public(public_key(pem).get()) == raw) return {Trust::kTrusted, id};
    } catch (const ArtifactError&) {
      continue;  // trusted_keys() only returns parsable keys; a caller's bad one is not a match
    }
  }
  return {Trust::kUnknownKey, id};
}

std::string config_dir() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/honed";
  const char* home = std::getenv("HOME");
  if (home == nullptr || home[0] == '\0') {
    const passwd* pw = getpwuid(getuid());
    home = pw != nullptr ? pw->pw_dir : "/";
  }
  return std::string(home) + "/.config/honed";
}

std::vector<std::string> trusted_keys(const std::string& dir) {
  std::vector<std::string> names;
  const std::string folder = dir + "/trusted";
  if (DIR* d = opendir(folder.c_str())) {
    while (const dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 4 && name.ends_with(".pub")) names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> out;
  for (const std::string& name : names) {
    std::ifstream in(folder + "/" + name);
    std::stringstream text;
    text << in.rdbuf();
    try {
      public_key(text.str());
      out.push_back(text.str());
    } catch (const ArtifactError&) {
      continue;  // not a key: `honed trust --list` names it; loading never depends on it
    }
  }
  return out;
}

std::string untrusted_message(const std::string& path, const TrustCheck& check,
                              const std::string& native_entry, const std::string& opt_in) {
  std::string state;
  std::string fix;
  switch (check.trust) {
    case Trust::kUnsigned:
      state = "is unsigned";
      fix =
          "have its author sign it (`honed keygen`, then save again) and trust their public key "
          "with `honed trust PUBKEY`";
      break;
    case Trust::kUnknownKey:
      state = "is signed by key " + check.key_id + ", which is not trusted here";
      fix = "if you trust its author, run `honed trust PUBKEY` with their public key";
      break;
    case Trust::kBadSignature:
      state = "has a signature (key " + (check.key_id.empty() ? "?" : check.key_id) +
              ") that does not match its manifest: it was modified after signing";
      fix = "re-save it from the tuned model";
      break;
    case Trust::kTrusted:
      return "";
  }
  return path + " carries native code (" + native_entry + ") and " + state +
         "; honed loads native code only from artifacts signed by a trusted key: " + fix +
         ", or load it anyway with " + opt_in + " (see docs/trust.md)";
}

}  // namespace honed
