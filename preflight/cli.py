"""`warden preflight`: device and collective report, placement, quarantine; exit 3 when the profile
cannot be placed on healthy devices.

`add_parser(commands)` hooks the command into `warden`; `main()` is the same command on its own
(`python -m preflight ...`) for hosts that have torch but not warden's dependencies: it needs
pydantic and yaml only with `--profile`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from preflight.faults import Fault
from preflight.levels import LEVELS
from preflight.orchestrate import PreflightOptions, run_preflight
from preflight.platforms import resolve_platform
from preflight.quarantine import FILE_NAME, Quarantine, QuarantineError, default_state_root
from preflight.report import render_text
from service.errors import UserError

PLATFORM_CHOICES = ("auto", "cuda", "xpu", "cpu", "sim")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile YAML: model, devices, tensor_parallel, sim faults, settings")
    parser.add_argument("--platform", choices=PLATFORM_CHOICES, help="default: the profile's, else auto")
    parser.add_argument("--level", choices=LEVELS, default="quick", help="quick (every start) or full (after a crash)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument("--clear", metavar="DEVICE", help="take DEVICE (an index, or 'all') out of quarantine and exit")
    parser.add_argument(
        "--quarantine-file", type=Path, help="default: the profile's, else <state root>/quarantine.json"
    )
    parser.add_argument("--no-quarantine", action="store_true", help="neither read nor write the quarantine file")
    parser.add_argument("--sim-devices", type=int, default=None, help="sim without a profile: devices (default 4)")
    parser.add_argument(
        "--sim-fault",
        action="append",
        default=[],
        metavar="DEVICE:KIND[:DURING]",
        help="sim: inject a fault (crash, hang, wrong-result, device-lost, slow-link, alloc-fail)",
    )


def add_parser(commands: Any) -> None:
    """Register `preflight` on `warden`'s subcommands (`commands` is argparse's subparsers action)."""
    parser = commands.add_parser(
        "preflight", help="device and collective health, placement, quarantine (exit 3: cannot place)"
    )
    configure(parser)
    parser.set_defaults(func=command)


def _faults(args: argparse.Namespace) -> tuple[Fault, ...]:
    try:
        return tuple(Fault.parse(text) for text in args.sim_fault)
    except ValueError as error:
        raise UserError(str(error), "write faults as DEVICE:KIND[:DURING], e.g. 3:device-lost", exit_code=2) from None


def _options(args: argparse.Namespace) -> PreflightOptions:
    faults = _faults(args)
    if args.profile:
        from preflight.profiles import options_for_profile
        from service.profile import load_profile

        loaded = load_profile(args.profile)
        options = options_for_profile(
            loaded,
            level=args.level,
            platform=args.platform,
            quarantine_file=args.quarantine_file,
            use_quarantine=not args.no_quarantine,
        )
        if faults:
            options = replace(options, faults=(*options.faults, *faults))
        if args.sim_devices is not None:
            options = replace(options, sim_devices=args.sim_devices)
    else:
        quarantine = None if args.no_quarantine else (args.quarantine_file or default_state_root() / FILE_NAME)
        options = PreflightOptions(
            platform=resolve_platform(args.platform or "auto"),
            level=args.level,
            sim_devices=args.sim_devices or 4,
            faults=faults,
            quarantine_file=quarantine,
        )
    if options.faults and options.platform != "sim":
        raise UserError(
            f"faults can only be injected on the sim platform, not {options.platform}",
            "add --platform sim",
            exit_code=2,
        )
    bad = [f.device for f in options.faults if f.device >= options.sim_devices]
    if bad:
        raise UserError(
            f"fault on device {bad[0]}, but the simulation has {options.sim_devices} devices",
            "use a device index below the number of simulated devices",
            exit_code=2,
        )
    return options


def _clear(args: argparse.Namespace) -> int:
    platform: str | None = None
    if args.profile:
        from preflight.profiles import quarantine_path_for
        from service.profile import load_profile

        loaded = load_profile(args.profile)
        path = args.quarantine_file or quarantine_path_for(loaded)
        platform = resolve_platform(args.platform or loaded.profile.platform)
    else:
        path = args.quarantine_file or default_state_root() / FILE_NAME
        platform = None if args.platform in (None, "auto") else resolve_platform(args.platform)
    if args.clear == "all":
        device = None
    elif args.clear.isdigit():
        device = int(args.clear)
    else:
        raise UserError(f"--clear takes a device index or 'all', not {args.clear!r}", "e.g. --clear 3", exit_code=2)
    try:
        removed = Quarantine(path).clear(platform, device)
    except QuarantineError as error:
        raise UserError(str(error), "fix the file by hand, or delete it to clear every device") from None
    if args.json:
        print(json.dumps({"path": str(path), "cleared": [e.to_dict() for e in removed]}, indent=2))
    elif removed:
        for entry in removed:
            print(f"cleared {entry.platform} device {entry.device} (quarantined since {entry.since}: {entry.reason})")
    else:
        which = "no device is" if device is None else f"device {device} is not"
        print(f"{which} in quarantine ({path}); nothing to clear")
    return 0


def command(args: argparse.Namespace) -> int:
    if args.clear is not None:
        return _clear(args)
    options = _options(args)
    try:
        report = run_preflight(options)
    except QuarantineError as error:
        raise UserError(str(error), "fix the file by hand, or delete it to clear every device") from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_text(report))
    return report.exit_code()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preflight", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return command(args)
    except UserError as error:
        print(f"preflight: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
