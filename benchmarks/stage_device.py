"""The device that measured a stage, stamped into the stage's JSON (benchmarks/accelerator.sh):
``backend`` and ``device_kind`` from the set-up's devices.json, and ``plan_backend`` where the
plan was another backend's (ACCEL_BACKEND, a plan rehearsed on another machine). A JSON that is
missing or unreadable (a stage killed mid-write) is left as it is.

    python benchmarks/stage_device.py DEVICES_JSON PLAN_BACKEND STAGE_JSON...
"""

from __future__ import annotations

import json
import sys


def stamp(path: str, device: dict, plan_backend: str) -> bool:
    """Adds the device's backend and kind to the JSON object at ``path``; False if unreadable."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    data.update(backend=device["backend"], device_kind=device["device_kind"])
    if plan_backend != device["backend"]:
        data["plan_backend"] = plan_backend
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    return True


def main(argv=None) -> int:
    devices_json, plan_backend, *paths = sys.argv[1:] if argv is None else argv
    with open(devices_json) as f:
        device = json.load(f)
    for path in paths:
        stamp(path, device, plan_backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
