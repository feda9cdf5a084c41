"""The host as a device: names and memory for the `cpu` and `sim` platforms."""

from __future__ import annotations

import os


def host_device_name(platform: str, index: int) -> str:
    if platform == "sim":
        return f"sim device {index} (CPU memory)"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "host CPU"


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 0
