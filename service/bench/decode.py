"""Single-request decode speed through the engine's endpoint, stamped with the run identity it was measured on.

Greedy completions of a fixed length (`ignore_eos`), one at a time: the time to the first token, then decode tokens
per second over the rest (measure() says how). The result file carries the supervisor's `/identity` and placement,
so `warden bench compare` can refuse to set two numbers side by side unless only what is meant to differ differs
(the seeds: never compare runs whose identities do not match).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import urllib.error
from dataclasses import dataclass
from typing import Any

from service.errors import UserError
from service.supervisor.readiness import request_json

FORMAT = "warden-bench/1"
PROMPT = (
    "An operator's log from a long night: the second card wedged after the driver update, the collective hung, and "
    "the engine was restarted on the two healthy cards. Summarise what happened next, step by step."
)


@dataclass(frozen=True)
class Measurement:
    ttft_s: float
    decode_s: float
    tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.tokens - 1) / self.decode_s if self.tokens > 1 and self.decode_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_s": round(self.ttft_s, 4),
            "decode_s": round(self.decode_s, 4),
            "tokens": self.tokens,
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
        }


def timed_completion(url: str, model: str, max_tokens: int, timeout_s: float) -> tuple[float, int]:
    """Seconds for one greedy completion of exactly `max_tokens` tokens (`ignore_eos`), and the tokens it made."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    try:
        status, completion = request_json(f"{url}/v1/completions", timeout_s, body)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(f"engine not reachable at {url}: {reason}", "start it, or pass its --url") from None
    elapsed = time.perf_counter() - started
    if status != 200 or not isinstance(completion, dict):
        raise UserError(f"POST {url}/v1/completions answered {status}: {str(completion)[:200]}", "check its log")
    return elapsed, int((completion.get("usage") or {}).get("completion_tokens", 0))


def measure(url: str, model: str, max_tokens: int, timeout_s: float) -> Measurement:
    """A one-token completion, then a `max_tokens` one: the first is the time to the first token, the difference is
    the decode of the other `max_tokens - 1`. Timing whole requests, not a stream's chunks: a server may deliver a
    stream's tokens in bursts, and then the chunks' arrival says nothing about when each token was made."""
    first_s, _ = timed_completion(url, model, 1, timeout_s)
    total_s, tokens = timed_completion(url, model, max_tokens, timeout_s)
    if tokens != max_tokens:
        raise UserError(
            f"the engine made {tokens} tokens where {max_tokens} were asked (ignore_eos)",
            "use an engine that honours ignore_eos (vLLM does), or a smaller --max-tokens than its max_model_len",
        )
    return Measurement(ttft_s=first_s, decode_s=max(total_s - first_s, 0.0), tokens=tokens)


def supervisor_facts(api: str | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The identity and placement the supervisor launched with; empty when no supervisor was named or it has none."""
    if api is None:
        return {}
    facts: dict[str, Any] = {}
    try:
        status, identity = request_json(f"{api}/identity", timeout_s)
        if status == 200 and isinstance(identity, dict):
            facts["identity"] = identity
        status, snapshot = request_json(f"{api}/status", timeout_s)
        if status == 200 and isinstance(snapshot, dict):
            facts["placement"] = snapshot.get("placement")
            facts["profile"] = snapshot.get("profile")
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(f"no supervisor answers at {api}: {reason}", "pass the api address of `warden run`") from None
    return facts


def run_bench(
    url: str, model: str, *, api: str | None, max_tokens: int, runs: int, warmup: int, timeout_s: float
) -> dict[str, Any]:
    stamp = supervisor_facts(api)
    for _ in range(warmup):
        measure(url, model, max_tokens, timeout_s)
    measured = [measure(url, model, max_tokens, timeout_s) for _ in range(runs)]
    rates = [m.decode_tokens_per_s for m in measured]
    return {
        "format": FORMAT,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"name": platform.node(), "cores": os.cpu_count(), "python": platform.python_version()},
        "engine": {"url": url, "model": model},
        "identity": stamp.get("identity"),
        "placement": stamp.get("placement"),
        "profile": stamp.get("profile"),
        "params": {"prompt": PROMPT, "max_tokens": max_tokens, "runs": runs, "warmup": warmup},
        "runs": [m.to_json() for m in measured],
        "summary": {
            "decode_tokens_per_s_median": round(statistics.median(rates), 2),
            "decode_tokens_per_s_min": round(min(rates), 2),
            "decode_tokens_per_s_max": round(max(rates), 2),
            "ttft_s_median": round(statistics.median(m.ttft_s for m in measured), 4),
        },
    }
