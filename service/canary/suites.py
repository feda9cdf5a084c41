"""The canary suites: fixed prompts, greedy, each with the most tokens it may take.

`json` constrains every answer with a regular expression for a small JSON object: it drives the structured-output
path (the grammar's token masks, applied on every step and, with speculative decoding, on every draft), which a plain
prompt never touches, and each answer must parse. A regular expression rather than a JSON schema: a schema admits
unbounded whitespace, which a weak model fills until it runs out of tokens. `color` is free text about colours, long
enough for a divergence to show. A suite's cases are part of a reference file's contract: change them only with
a new suite name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COLORS = "(red|green|blue|amber|white|black)"


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str
    max_tokens: int
    regex: str | None = None  # the answer's shape, enforced by the engine's structured outputs

    def request(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "seed": 0,
            "return_token_ids": True,
        }
        if self.regex is not None:
            body["structured_outputs"] = {"regex": self.regex}
        return body


def _json_cases() -> list[Case]:
    shapes = [
        ("status", "Report the status of device {i} as JSON:", rf'\{{"device": [0-7], "light": "{COLORS}"\}}'),
        ("health", "Is device {i} healthy? Answer in JSON:", r'\{"healthy": (true|false), "errors": [0-9]\}'),
        ("pair", "Give two colours for rack {i} as a JSON list:", rf'\["{COLORS}", "{COLORS}"\]'),
        ("nested", "Describe link {i} as JSON:", rf'\{{"link": \{{"up": (true|false), "color": "{COLORS}"\}}\}}'),
    ]
    return [Case(f"{name}-{i}", prompt.format(i=i), 48, regex) for i in range(2) for name, prompt, regex in shapes]


def _color_cases() -> list[Case]:
    prompts = [
        "The status light on the first card glows",
        "Name the colour of the sky over the lab at dusk",
        "When a device wedges, the panel turns",
        "The cable between the two cards is painted",
        "Write one sentence about a green light that means healthy",
        "The operator wrote down the colour of every warning lamp",
        "A red light, an amber light and a blue light mean",
        "Describe the colours of a server room at three in the morning",
    ]
    return [Case(f"color-{i}", prompt, 24) for i, prompt in enumerate(prompts)]


SUITES: dict[str, list[Case]] = {"json": _json_cases(), "color": _color_cases()}
DEFAULT_REPEATS = 12  # 8 cases x 12 repeats: the seeds' 96 per suite
