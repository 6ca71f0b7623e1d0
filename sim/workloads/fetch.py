"""Getting traces: the download ids, the local cache, and a checked download.

Traces are not committed. `ppsim workload fetch ID` downloads one into the cache folder
(`$PIPESIM_CACHE`, default `~/.cache/pipesim`) under its original file name, after checking its
SHA-256 against the upstream file; trace workloads then find it there by that name.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from sim.core.errors import ConfigError, DataError

UPSTREAM = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data"


@dataclass(frozen=True)
class Download:
    id: str
    file_name: str
    url: str
    sha256: str


# Hashes of the upstream files (checked against the byte-for-byte copies in shared/data).
DOWNLOADS = {
    d.id: d
    for d in (
        Download(
            "azure-conv-2023",
            "AzureLLMInferenceTrace_conv.csv",
            f"{UPSTREAM}/AzureLLMInferenceTrace_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        ),
        Download(
            "azure-code-2023",
            "AzureLLMInferenceTrace_code.csv",
            f"{UPSTREAM}/AzureLLMInferenceTrace_code.csv",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        ),
    )
}


def cache_dir() -> Path:
    env = os.environ.get("PIPESIM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pipesim"


def download_for_file(file_name: str) -> Download | None:
    """The download that provides `file_name`, if any (for 'how to get it' messages)."""
    return next((d for d in DOWNLOADS.values() if d.file_name == file_name), None)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(download_id: str, *, url: str | None = None, cache: Path | None = None, force: bool = False) -> Path:
    """Download `download_id` into the cache (or `cache`) and return its path.

    `url` replaces the upstream URL (a mirror, or a file:// URL in tests); the SHA-256 is
    checked either way. An already cached file with the right hash is kept as it is.
    """
    if download_id not in DOWNLOADS:
        raise ConfigError(f"unknown download id {download_id!r}; allowed: {', '.join(sorted(DOWNLOADS))}")
    d = DOWNLOADS[download_id]
    folder = Path(cache) if cache is not None else cache_dir()
    target = folder / d.file_name
    if not force and target.is_file() and sha256_of(target) == d.sha256:
        return target
    src = url or d.url
    folder.mkdir(parents=True, exist_ok=True)
    # Download next to the target and rename only after the hash check, so a failed or
    # interrupted download never leaves a file a trace workload would read.
    part = folder / f".{d.file_name}.part"
    import urllib.error  # here, not at the top: only fetching needs the network stack
    import urllib.request

    try:
        with urllib.request.urlopen(src, timeout=60) as resp, part.open("wb") as fh:
            while block := resp.read(1 << 20):
                fh.write(block)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        part.unlink(missing_ok=True)
        reason = getattr(exc, "reason", exc)
        raise DataError(f"fetch {download_id}: cannot download {src}: {reason}") from None
    got = sha256_of(part)
    if got != d.sha256:
        part.unlink(missing_ok=True)
        raise DataError(f"fetch {download_id}: {src}: SHA-256 mismatch: expected {d.sha256}, got {got}")
    os.replace(part, target)
    return target
