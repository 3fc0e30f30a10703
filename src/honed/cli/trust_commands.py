"""src/honed/cli/trust_commands.py: `honed keygen`, `honed trust`: keys that sign native code."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

KEYGEN_EXAMPLES = """examples:
  honed keygen                 make your signing key; honed.save signs with it from now on
  honed keygen --force         replace it (artifacts signed with the old key stay loadable only
                               where that key is still trusted)
"""

TRUST_EXAMPLES = """examples:
  honed trust alice.pub        trust artifacts (and their native code) signed by this key
  honed trust --list           the trusted keys
"""


def add_parsers(sub: Any) -> None:
    """Add the keygen and trust subcommands to the `honed` parser."""
    raw = argparse.RawDescriptionHelpFormatter
    keygen = sub.add_parser(
        "keygen",
        help="make the Ed25519 key honed.save signs artifacts with (docs/trust.md)",
        epilog=KEYGEN_EXAMPLES,
        formatter_class=raw,
    )
    keygen.add_argument("--force", action="store_true", help="replace an existing key")
    keygen.set_defaults(run=run_keygen)
    trust = sub.add_parser(
        "trust",
        help="trust artifacts signed by a public key, so their native code may load",
        epilog=TRUST_EXAMPLES,
        formatter_class=raw,
    )
    trust.add_argument(
        "keyfile", nargs="?", type=Path, help="a public key (.pub) written by `honed keygen`"
    )
    trust.add_argument("--list", action="store_true", help="list the trusted keys")
    trust.set_defaults(run=run_trust)


def run_keygen(args: argparse.Namespace) -> int:
    from honed import trust

    private, public, key_id = trust.keygen(force=args.force)
    print(f"key {key_id}: private {private} (mode 600), public {public}")
    print("honed.save now signs artifacts with it, and this machine trusts it.")
    print(f"Elsewhere, trust it with: honed trust {public.name} (copy the .pub file there)")
    return 0


def run_trust(args: argparse.Namespace) -> int:
    from honed import config, trust
    from honed.errors import InputError

    if args.list:
        rows = trust.trusted()
        if not rows:
            print(f"no trusted keys (in {config.config_dir / trust.TRUSTED})")
        for key_id, path in rows:
            print(f"{key_id}  {path}")
        return 0
    if args.keyfile is None:
        raise InputError("give the public key to trust (honed trust KEYFILE), or --list")
    key_id = trust.trust(args.keyfile)
    print(f"trusted key {key_id}: artifacts it signed load here, native code included")
    return 0
