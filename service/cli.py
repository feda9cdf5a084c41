"""`warden` command line. Exit codes: 0 ok, 1 error, 2 usage, 3 refused/unhealthy."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from service import __version__
from service.argtypes import non_negative_number
from service.errors import UserError


def _cmd_run(args: argparse.Namespace) -> int:
    from service.supervisor.run import run_profile

    return run_profile(args.profile)


def _cmd_status(args: argparse.Namespace) -> int:
    from service.status_cmd import DEFAULT_URL, api_url_of, fetch_status, render_status

    url = api_url_of(args.profile) if args.profile else args.url or DEFAULT_URL
    snap = fetch_status(url)
    print(json.dumps(snap, indent=1) if args.json else render_status(snap))
    return 0 if snap.get("state") == "ready" else 3


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from service.models.tiny import build_tiny_model

    try:
        out = build_tiny_model(Path(args.dir), mtp=args.mtp, peaky=args.peaky, seed=args.seed, mtp_noise=args.mtp_noise)
    except ImportError as error:
        raise UserError(
            f"building a model needs torch, transformers, safetensors and tokenizers ({error})",
            "install them (`pip install 'warden[model]'`) or run ops/scripts/bootstrap",
        ) from None
    print(out)
    return 0


def _cmd_model_config(args: argparse.Namespace) -> int:
    from service.models.qwen36 import KNOWN_CONFIGS

    writer = KNOWN_CONFIGS[args.name]
    print(writer(Path(args.dir), mtp_weights=args.mtp_weights))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from preflight.cli import add_parser as add_preflight_command
    from service.bench.cli import add_parser as add_bench_command
    from service.canary.cli import add_parser as add_canary_command
    from service.guard.cli import add_parser as add_guard_commands
    from service.models.qwen36 import KNOWN_CONFIGS
    from service.reap_cmd import add_parser as add_reap_command
    from service.restart_cmd import add_parser as add_restart_command

    parser = argparse.ArgumentParser(prog="warden", description="Supervise vLLM with operational guards.")
    parser.add_argument("--version", action="version", version=f"warden {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="supervise a vLLM server described by a profile (foreground)")
    run.add_argument("profile", help="profile YAML, e.g. ops/profiles/tiny-cpu.yaml")
    run.set_defaults(func=_cmd_run)
    add_guard_commands(commands)
    add_preflight_command(commands)
    add_reap_command(commands)
    add_canary_command(commands)
    add_bench_command(commands)
    add_restart_command(commands)

    status = commands.add_parser("status", help="the running supervisor's state (exit 3 unless ready)")
    address = status.add_mutually_exclusive_group()
    address.add_argument("--url", help="supervisor API (default http://127.0.0.1:9400)")
    address.add_argument("--profile", help="take the API address from this profile's api.host and api.port")
    status.add_argument("--json", action="store_true", help="the full /status JSON")
    status.set_defaults(func=_cmd_status)

    model = commands.add_parser("model", help="build tiny test models and real-dimension configs")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="WHAT")
    tiny = model_commands.add_parser("tiny", help="random-weight Qwen3.5-MoE hybrid (GDN + attention + MoE)")
    tiny.add_argument("dir", help="new folder to write the model into")
    tiny.add_argument("--mtp", action="store_true", help="add one MTP layer (mtp.* tensors)")
    tiny.add_argument(
        "--peaky", action="store_true", help="large-margin greedy choices: identical outputs across engine settings"
    )
    tiny.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tiny.add_argument(
        "--mtp-noise",
        type=non_negative_number,
        default=0.0,
        metavar="X",
        help="with --mtp --peaky: blur the MTP layer's view of the next token so that some drafts are rejected "
        "(the main model is unchanged; at 3.5 the CPU engine accepted 22 %% of k=3 drafts; default 0: nearly all)",
    )
    tiny.set_defaults(func=_cmd_model_tiny)
    config = model_commands.add_parser("config", help="config.json + empty-weights index, real dimensions")
    config.add_argument("name", choices=sorted(KNOWN_CONFIGS))
    config.add_argument("dir", help="folder to write into")
    config.add_argument("--mtp-weights", action="store_true", help="list mtp.* tensors in the index")
    config.set_defaults(func=_cmd_model_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.func(args)
    except UserError as error:
        print(f"warden: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
