"""src/honed/trust.py: signing keys, the trusted key set, signed cache payloads, private folders.

Native code (a compiled .so in an AOTInductor package, a TensorRT engine) runs when it is loaded,
so honed loads it only from artifacts and cache entries signed by a key this user trusts
(docs/trust.md). Keys are Ed25519 (OpenSSL, through the engine) and live in ``config.config_dir``:
``signing_key.pem`` (private, mode 0600), ``signing_key.pub``, ``trusted/<key id>.pub`` (every key
whose signatures are trusted) and ``cache_key.pem`` (signs tuning-cache payloads when the user has
no signing key).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from honed import _core, config
from honed.errors import ConfigError, InputError

log = logging.getLogger("honed")

PRIVATE_KEY = "signing_key.pem"
PUBLIC_KEY = "signing_key.pub"
CACHE_KEY = "cache_key.pem"
TRUSTED = "trusted"

_told_unsigned = False


# -- keys --------------------------------------------------------------------------------------
def _write_new(path: Path, data: str, mode: int) -> None:
    """Create ``path`` with ``mode`` (never readable by others in between); refuses to replace."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(data)


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def keygen(force: bool = False) -> tuple[Path, Path, str]:
    """Make this user's signing key; returns (private key, public key, key id).

    The public key is trusted at once: artifacts signed with it load here.
    """
    folder = _private_dir(config.config_dir)
    private, public = folder / PRIVATE_KEY, folder / PUBLIC_KEY
    if private.exists() and not force:
        raise InputError(
            f"honed keygen: {private} exists (key {key_id_of_file(public)}); keep it, or pass "
            "--force to replace it (artifacts signed with the old key then load only where that "
            "key stays trusted)"
        )
    private_pem, public_pem = _core.generate_signing_key()
    for path in (private, public):
        path.unlink(missing_ok=True)
    _write_new(private, private_pem, 0o600)
    _write_new(public, public_pem, 0o644)
    return private, public, trust(public)


def key_id_of_file(path: Path) -> str:
    try:
        return str(_core.key_id(path.read_text()))
    except (OSError, UnicodeDecodeError, _core.ArtifactError):
        return "?"


def trust(public_key_file: str | os.PathLike[str]) -> str:
    """Add a public key (PEM, as `honed keygen` writes it) to the trusted set; returns its id."""
    path = Path(public_key_file)
    try:
        pem = path.read_text()
        kid = str(_core.key_id(pem))
    except OSError as e:
        raise InputError(f"honed trust: cannot read {path} ({e.strerror})") from None
    except (UnicodeDecodeError, _core.ArtifactError):
        raise InputError(
            f"honed trust: {path} is not an Ed25519 public key in PEM form; give the .pub file "
            "that `honed keygen` wrote on the signer's machine"
        ) from None
    target = _private_dir(config.config_dir / TRUSTED) / f"{kid}.pub"
    if not target.exists():
        _write_new(target, pem, 0o644)
    return kid


def trusted() -> list[tuple[str, Path]]:
    """(key id, file) of every trusted public key."""
    folder = config.config_dir / TRUSTED
    return [(key_id_of_file(p), p) for p in sorted(folder.glob("*.pub"))]


def signing_key() -> str | None:
    """The private key honed.save signs with (HONED_SIGNING_KEY, else `honed keygen`'s), if any."""
    path = Path(config.signing_key) if config.signing_key else config.config_dir / PRIVATE_KEY
    try:
        pem = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        if config.signing_key:
            raise ConfigError(
                f"HONED_SIGNING_KEY={config.signing_key}: no such file; give the private key "
                "that `honed keygen` wrote, or unset it"
            ) from None
        return None
    except OSError as e:
        raise ConfigError(f"signing key {path}: cannot be read ({e.strerror})") from None
    try:
        _core.public_key_of(pem)
    except _core.ArtifactError:
        raise ConfigError(
            f"signing key {path} is not an Ed25519 private key in PEM form; make one with "
            "`honed keygen`"
        ) from None
    return pem


def trusted_public_keys() -> list[str]:
    """The trusted set: ``<config_dir>/trusted/*.pub`` and the public half of the signing key."""
    keys = [str(k) for k in _core.trusted_keys(str(config.config_dir))]
    try:
        own = signing_key()
    except ConfigError:
        own = None
    if own is not None:
        keys.append(str(_core.public_key_of(own)))
    return keys


def key_for_save() -> str | None:
    """The key honed.save signs with; made on the first save when the user has none.

    Signing by default keeps save-then-load on one machine working with native code while a
    tampered or foreign artifact is still refused. When the key cannot be made (a read-only
    config folder) the artifact is saved unsigned and the user is told once.
    """
    key = signing_key()
    if key is not None:
        return key
    try:
        private, _, key_id = keygen()
    except (OSError, InputError) as e:
        _tell_unsigned_once(str(e))
        return None
    log.info(
        "honed.save: made your signing key %s (key %s); artifacts you save load here, and load "
        "elsewhere once its .pub is trusted there with `honed trust` (docs/trust.md)",
        private,
        key_id,
    )
    return signing_key()


def _tell_unsigned_once(why: str) -> None:
    global _told_unsigned
    if not _told_unsigned:
        _told_unsigned = True
        log.warning(
            "honed.save: saved unsigned (no signing key could be made: %s). Artifacts with native "
            "code (AOTInductor, TensorRT) then load only with trust_native_code=True; make a key "
            "with `honed keygen` or set HONED_SIGNING_KEY (docs/trust.md)",
            why,
        )


# -- the tuning cache --------------------------------------------------------------------------
def _cache_key() -> str:
    """The user's signing key, else a per-user cache key made on first use."""
    own = signing_key()
    if own is not None:
        return own
    path = _private_dir(config.config_dir) / CACHE_KEY
    try:
        return path.read_text()
    except FileNotFoundError:
        private_pem, _ = _core.generate_signing_key()
        try:
            _write_new(path, private_pem, 0o600)
        except FileExistsError:
            return path.read_text()  # another process made it first
        return str(private_pem)


def _cache_public_keys() -> list[str]:
    """The per-user cache key's public half, when that key exists. With trusted_public_keys()
    (the signing key's public half among them) these are every key this user's cache entries
    may be signed with: a first honed.save makes the signing key, and entries the cache key
    signed before it are still this user's own (without it a re-tune after the first save would
    rebuild every payload candidate)."""
    try:
        return [str(_core.public_key_of((config.config_dir / CACHE_KEY).read_text()))]
    except (OSError, _core.ArtifactError):  # none made yet, or not a key: it vouches for nothing
        return []


# The key ids a cache payload may be signed with, and the state of the files they came from.
_KNOWN: tuple[Any, frozenset[str]] | None = None


def _key_files_state() -> tuple[Any, ...]:
    """What the trusted set is made of: the config folder, the trusted folder and each key file
    (owner, mode, size, modification time), so a key added, removed, edited or loosened shows."""
    root = config.config_dir
    own = Path(config.signing_key) if config.signing_key else root / PRIVATE_KEY
    paths = [root, root / TRUSTED, own, root / CACHE_KEY]
    try:
        paths += sorted((root / TRUSTED).iterdir())
    except OSError:
        pass
    state: list[Any] = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            state.append((str(path), None))
            continue
        state.append((str(path), st.st_ino, st.st_uid, st.st_mode, st.st_size, st.st_mtime_ns))
    return tuple(state)


def known_key_ids() -> frozenset[str]:
    """The ids of the keys this user's cache payloads may be signed with: the trusted set and
    the cache key. Kept while their files stay as they were: deriving them decodes every key
    with OpenSSL, which a JIT program's restart did beside its calls for each cached candidate."""
    global _KNOWN
    state = _key_files_state()
    known = _KNOWN
    if known is not None and known[0] == state:
        return known[1]
    ids = frozenset(_core.key_id(k) for k in [*trusted_public_keys(), *_cache_public_keys()])
    _KNOWN = (state, ids)
    return ids


def _payload_digest(key: str, hashes: dict[str, str]) -> bytes:
    lines = [f"honed-cache-payload\n{key}"] + [f"{n}\t{h}" for n, h in sorted(hashes.items())]
    return "\n".join(lines).encode()


# The bytes hashed between two chances to give way (below).
_HASH_PIECE_BYTES = 8 << 20


def _sha256(data: bytes) -> str:
    """SHA-256 of ``data`` in pieces, giving way between them (honed.pipeline.courtesy): a
    payload of hundreds of MB hashed in one go beside a JIT program's call slowed that call."""
    import hashlib

    from honed.pipeline.courtesy import give_way

    digest = hashlib.sha256()
    view = memoryview(data)
    for start in range(0, len(view), _HASH_PIECE_BYTES):
        digest.update(view[start : start + _HASH_PIECE_BYTES])  # without the GIL
        give_way()
    return digest.hexdigest()


def sign_payload(key: str, files: dict[str, bytes]) -> dict[str, Any]:
    """Record fields that bind a cache entry's payload files to its key, signed."""
    hashes = {name: _sha256(data) for name, data in files.items()}
    private = _cache_key()
    signature = _core.sign(private, _payload_digest(key, hashes))
    return {
        "files_sha256": hashes,
        "files_signature": {"public_key": _core.public_key_of(private), "ed25519": signature.hex()},
    }


def payload_problem(key: str, record: dict[str, Any], files: dict[str, bytes] | None) -> str:
    """Why a cache entry's payload must not be used ("" when it verifies)."""
    hashes, sig = record.get("files_sha256"), record.get("files_signature")
    if not isinstance(hashes, dict) or not isinstance(sig, dict):
        return "its payload is not signed"
    if files is None or set(files) != set(hashes):
        return "its payload files are missing"
    for name, data in files.items():
        if _sha256(data) != hashes[name]:
            return f"payload file {name!r} does not match its SHA-256"
    try:
        public, signature = str(sig["public_key"]), bytes.fromhex(str(sig["ed25519"]))
        ok = _core.verify(public, _payload_digest(key, hashes), signature)
        known = known_key_ids()
    except (KeyError, ValueError, _core.ArtifactError, ConfigError):
        return "its payload signature is malformed"
    if not ok:
        return "its payload signature does not verify"
    if _core.key_id(public) not in known:
        return f"its payload is signed by key {_core.key_id(public)}, which is not trusted here"
    return ""


# -- private folders ---------------------------------------------------------------------------
def folder_problem(path: Path) -> str:
    """Why ``path`` (a folder honed keeps trusted state in) must not be used, as ssh judges its
    key folders: it must belong to this user and not be writable by group or others. "" when fine
    or absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return ""
    except OSError as e:
        return f"{path} cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != os.getuid():
        return (
            f"{path} belongs to another user (uid {st.st_uid}); use a folder of your own "
            "(HONED_CACHE_DIR)"
        )
    if st.st_mode & 0o022:
        return (
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod go-w {path}`"
        )
    return ""


def mkdir_private(path: Path) -> None:
    """Create ``path`` and its missing parents as folders only this user can use."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
