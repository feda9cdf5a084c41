"""`warden restart [--profile P | --url URL --token-file F]`: ask a running supervisor for a fresh engine.

POST /actions/restart with the profile's bearer token: warden ends the engine as a stop would, runs a full preflight
(a device cleared from quarantine is placed again) and launches at once. Exit 0 when accepted; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path

from service.errors import UserError
from service.profile import load_profile, reachable_url
from service.status_cmd import DEFAULT_URL


def _address(args: argparse.Namespace) -> tuple[str, str]:
    from service.supervisor.run import read_token, read_token_file  # the supervisor's own reading of the token

    if args.profile:
        loaded = load_profile(args.profile)
        api = loaded.profile.api
        token = read_token(loaded)
        if token is None:
            raise UserError(
                f"profile {args.profile} has no api.token_file, so its supervisor takes no actions",
                "add api.token_file (a file holding a random token) and restart warden",
            )
        return reachable_url(api.host, api.port), token
    if not args.token_file:
        raise UserError("--url needs --token-file", "pass the token file the profile's api.token_file names")
    url = (args.url or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url {url!r} is not an http(s) URL", f"e.g. {DEFAULT_URL}")
    remedy = "pass the file the profile's api.token_file names"
    return url, read_token_file(Path(args.token_file), "--token-file", remedy)


def run_restart(args: argparse.Namespace) -> int:
    url, token = _address(args)
    request = urllib.request.Request(  # noqa: S310 (scheme checked)
        f"{url}/actions/restart", data=b"{}", method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (scheme checked)
            answer = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        remedies = {
            401: "the token does not match the one the supervisor read from api.token_file",
            403: "set api.token_file in the profile and restart warden",
            409: "wait for the supervisor to leave that state (`warden status`), or stop and start warden",
        }
        raise UserError(f"{url} refused the restart ({error.code}): {detail}", remedies.get(error.code, "")) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(f"no supervisor answers at {url}: {reason}", "check that `warden run` is running") from None
    print(f"restart accepted (the supervisor was {answer.get('state')}); `warden status` follows it")
    return 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "restart", help="ask the running supervisor to end the engine, preflight in full and launch it again"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--profile", help="the supervisor's address and token file from this profile")
    where.add_argument("--url", help=f"the supervisor's API (default {DEFAULT_URL}); needs --token-file")
    parser.add_argument("--token-file", help="with --url: the file holding the bearer token")
    parser.set_defaults(func=run_restart)
