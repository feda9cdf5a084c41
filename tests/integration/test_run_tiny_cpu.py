"""`warden run` supervising a real vLLM server (CPU build) on the tiny peaky Qwen3.5-MoE hybrid."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from support import free_port, http, http_json, port_is_free, wait_for

from service.supervisor.procfs import ProcFS

REPO = Path(__file__).resolve().parents[2]
WARDEN = [sys.executable, "-m", "service"]

pytestmark = pytest.mark.engine


def write_profile(tmp_path: Path, model: Path) -> tuple[Path, dict]:
    """The embedded default profile, with this test's model, free ports and its own state folder."""
    data = yaml.safe_load((REPO / "ops" / "profiles" / "tiny-cpu.yaml").read_text())
    data["model"]["path"] = str(model)
    data["engine"]["port"] = free_port()
    data["api"]["port"] = free_port()
    data["supervisor"]["state_dir"] = str(tmp_path / "state")
    data["supervisor"]["startup_timeout_s"] = 240
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def live_members(sid: int) -> list[str]:
    return [f"{p.pid} {p.comm}" for p in ProcFS().session_members(sid) if not p.is_zombie]


def test_run_serves_recovers_from_a_killed_engine_and_stops_cleanly(tmp_path: Path, tiny_peaky_model: Path) -> None:
    """1. warden run starts vLLM; /readyz is 503 until the canary passes, then 200.
    2. A greedy completion through vLLM follows the peaky model's token chain.
    3. /status and /metrics describe the running engine.
    4. SIGKILL the engine's front process: its EngineCore orphans are ended, a new engine becomes ready.
    5. SIGTERM warden: it exits 0 only after no process of the engine's session is left; both ports free."""
    profile, data = write_profile(tmp_path, tiny_peaky_model)
    api = f"http://127.0.0.1:{data['api']['port']}"
    engine_url = f"http://127.0.0.1:{data['engine']['port']}"
    log = (tmp_path / "warden.log").open("wb")
    warden = subprocess.Popen([*WARDEN, "run", str(profile)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        # 1. not ready before the canary, ready after
        status, body = wait_for(lambda: _get(f"{api}/readyz"), timeout_s=30, what="the supervisor's API")
        if status == 503:
            assert body["ready"] is False
        wait_for(lambda: _get(f"{api}/readyz")[0] == 200 or warden.poll() is not None, timeout_s=240, what="readiness")
        assert warden.poll() is None, (tmp_path / "warden.log").read_text()
        assert _get(f"{api}/healthz") == (200, {"status": "ok"})

        # 2. a real completion from vLLM, following the peaky model's greedy chain
        status, completion = http_json(
            f"{engine_url}/v1/completions",
            {
                "model": "tiny",
                "prompt": "Devices fail in quiet ways",
                "max_tokens": 12,
                "temperature": 0,
                "return_token_ids": True,
            },
        )
        assert status == 200, completion
        choice = completion["choices"][0]
        chain = _chain(tiny_peaky_model)
        tokens = choice["prompt_token_ids"][-1:] + choice["token_ids"]
        assert len(choice["token_ids"]) == 12
        assert all(chain[a] == b for a, b in itertools.pairwise(tokens))
        # a one-token prompt, which kills vLLM's CPU engine as shipped (guard rule cpu-gdn-one-token-rows), is
        # served by the same engine with warden's vLLM fixes
        _follows_chain(engine_url, chain, [tokens[0]], max_tokens=4)
        assert _snapshot(api)["launches"] == 1
        engine_log = (tmp_path / "state" / "tiny-cpu" / "engine.log").read_text()
        assert "warden's vLLM CPU fixes installed (one-token rows: causal_conv1d_fwd_cpu, " in engine_log

        # 3. status and metrics
        status, snap = http_json(f"{api}/status")
        assert status == 200 and snap["state"] == "ready"
        first = snap["engine"]
        assert first["pid"] == first["session"]
        assert snap["urls"]["engine"] == engine_url
        assert snap["timings"]["time_to_ready_s"] > 0
        assert snap["canary"]["completion_tokens"] >= 1
        assert len(live_members(first["session"])) >= 2, "expected the API server and its EngineCore"
        status, raw = http(f"{api}/metrics")
        metrics = raw.decode()
        assert status == 200
        for line in (
            'warden_state{state="ready"} 1.0',
            "warden_engine_up 1.0",
            "warden_ready 1.0",
            "warden_engine_ready_duration_seconds_count 1.0",
            "warden_engine_starts_total 1.0",
        ):
            assert line in metrics

        # 4. kill -9 the front process: the orphaned EngineCore must not survive, a new engine serves
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(
            lambda: _snapshot(api)["launches"] == 2 and _snapshot(api)["state"] == "ready",
            timeout_s=240,
            what="the relaunched engine to become ready",
        )
        assert live_members(first["session"]) == []
        snap = _snapshot(api)
        assert snap["restarts"] == 1
        assert snap["last_failure"]["kind"] == "crashed" and "code -9" in snap["last_failure"]["reason"]
        assert snap["last_stop"]["survivors"] == []
        second = snap["engine"]
        assert second["session"] != first["session"]

        # 5. SIGTERM: warden ends the session and exits 0
        warden.send_signal(signal.SIGTERM)
        assert warden.wait(timeout=90) == 0
        assert live_members(second["session"]) == []
        assert port_is_free(data["engine"]["port"]) and port_is_free(data["api"]["port"])
    finally:
        if warden.poll() is None:
            warden.send_signal(signal.SIGTERM)
            warden.wait(timeout=90)
        log.close()


def _get(url: str) -> tuple[int, object] | None:
    try:
        return http_json(url, timeout_s=5)
    except OSError:
        return None


def _snapshot(api: str) -> dict:
    result = _get(f"{api}/status")
    return result[1] if result and isinstance(result[1], dict) else {"launches": 0, "state": "unreachable"}


def test_an_engine_left_by_a_killed_warden_is_ended_by_the_next(tmp_path: Path, tiny_peaky_model: Path) -> None:
    """The seeds' leaked workers, from the supervisor's side: warden dies (kill -9, the OOM killer) and its vLLM keeps
    running, holding the engine's port. `warden reap --dry-run` names it; the next `warden run` of the profile ends
    it (only it) and serves."""
    profile, data = write_profile(tmp_path, tiny_peaky_model)
    api = f"http://127.0.0.1:{data['api']['port']}"
    logs = [(tmp_path / f"warden-{n}.log").open("wb") for n in (1, 2)]
    first = subprocess.Popen([*WARDEN, "run", str(profile)], cwd=REPO, stdout=logs[0], stderr=subprocess.STDOUT)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: _snapshot(api)["state"] == "ready" or first.poll() is not None, timeout_s=240, what="ready")
        engine = _snapshot(api)["engine"]
        first.kill()
        assert first.wait(timeout=30) == -signal.SIGKILL
        left = live_members(engine["session"])
        assert len(left) >= 2, "expected vLLM's API server and EngineCore to outlive their supervisor"
        assert not port_is_free(data["engine"]["port"])

        dry = subprocess.run([*WARDEN, "reap", "--profile", str(profile), "--dry-run"], cwd=REPO, capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
        assert dry.returncode == 3, dry.stdout + dry.stderr
        assert f"warden pid {first.pid} ended without stopping its engine" in dry.stdout
        assert f"{engine['pid']} " in dry.stdout
        assert live_members(engine["session"]) == left

        second = subprocess.Popen([*WARDEN, "run", str(profile)], cwd=REPO, stdout=logs[1], stderr=subprocess.STDOUT)
        wait_for(lambda: _snapshot(api)["state"] == "ready" or second.poll() is not None, timeout_s=240, what="ready")
        assert second.poll() is None, (tmp_path / "warden-2.log").read_text()
        assert live_members(engine["session"]) == []
        assert _snapshot(api)["engine"]["session"] != engine["session"]
        text = (tmp_path / "warden-2.log").read_text()
        assert f"before launch: warden pid {first.pid} ended without stopping its engine: ended its" in text
        status, raw = http(f"{api}/metrics")
        assert status == 200 and f"warden_orphans_ended_at_start {float(len(left))}" in raw.decode()

        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=90) == 0
        assert not (tmp_path / "state" / "tiny-cpu" / "engine.json").exists()
    finally:
        for warden in (first, second):
            if warden is not None and warden.poll() is None:
                warden.send_signal(signal.SIGTERM)
                warden.wait(timeout=90)
        # a failed test leaves no engine behind either (reap ends only what carries this profile's launch marker)
        subprocess.run([*WARDEN, "reap", "--profile", str(profile)], cwd=REPO, timeout=120, check=False)
        for log in logs:
            log.close()


def test_run_refuses_a_profile_without_a_model_and_launches_nothing(tmp_path: Path) -> None:
    profile, _ = write_profile(tmp_path, tmp_path / "no-model-here")
    result = subprocess.run(
        [*WARDEN, "run", str(profile)], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "has no config.json" in result.stderr and "remedy:" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_refuses_a_guarded_config_before_touching_anything(tmp_path: Path, tiny_peaky_model: Path) -> None:
    """Speculation with prefix caching on kills the CPU engine: the guard refuses, nothing starts."""
    profile, data = write_profile(tmp_path, tiny_peaky_model)
    data["speculative"] = {"method": "mtp", "num_speculative_tokens": 1}
    profile.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [*WARDEN, "run", str(profile)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 3, result.stderr
    assert "cpu-spec-prefix-caching" in result.stderr
    assert "not launching" in result.stderr
    assert not (tmp_path / "state" / "tiny-cpu" / "engine.log").exists()
    assert "preflight quick" not in result.stderr  # refused before any device was probed


def test_run_refuses_when_preflight_finds_the_chosen_device_lost(tmp_path: Path, tiny_peaky_model: Path) -> None:
    """sim: 4 devices, the profile pins TP2 on [0, 1], device 1 is lost: no launch, the device is named
    and quarantined."""
    profile, data = write_profile(tmp_path, tiny_peaky_model)
    data.update(
        platform="sim",
        devices=[0, 1],
        tensor_parallel=2,
        sim={"devices": 4, "faults": [{"device": 1, "fault": "device-lost"}]},
    )
    data["preflight"] = {"collective": False}
    profile.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [*WARDEN, "run", str(profile)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 3, result.stderr
    assert "preflight cannot place the model" in result.stderr
    assert "DEVICE_LOST" in result.stderr or "device-lost" in result.stderr or "device lost" in result.stderr
    assert not (tmp_path / "state" / "tiny-cpu" / "engine.log").exists()
    quarantine = json.loads((tmp_path / "state" / "quarantine.json").read_text())
    assert [(e["platform"], e["device"]) for e in quarantine["devices"]] == [("sim", 1)]


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_mtp_drafts_of_the_peaky_model_are_accepted_and_change_nothing(
    tmp_path: Path, tiny_peaky_mtp_model: Path
) -> None:
    """The builder's MTP layer predicts the peaky chain: with MTP k=3 the engine accepts (nearly) every
    draft and the greedy output still follows the chain token for token."""
    profile, data = write_profile(tmp_path, tiny_peaky_mtp_model)
    data["speculative"] = {"method": "mtp", "num_speculative_tokens": 3}
    data["engine"]["args"].append("--no-enable-prefix-caching")  # spec + prefix caching crashes the CPU build
    profile.write_text(yaml.safe_dump(data))
    api = f"http://127.0.0.1:{data['api']['port']}"
    engine_url = f"http://127.0.0.1:{data['engine']['port']}"
    log = (tmp_path / "warden.log").open("wb")
    warden = subprocess.Popen([*WARDEN, "run", str(profile)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: (_get(f"{api}/readyz") or (0, None))[0] == 200 or warden.poll() is not None,
            timeout_s=240,
            what="readiness",
        )
        assert warden.poll() is None, (tmp_path / "warden.log").read_text()
        status, completion = http_json(
            f"{engine_url}/v1/completions",
            {"model": "tiny", "prompt": "Devices fail in quiet ways", "max_tokens": 48, "temperature": 0,
             "return_token_ids": True},
        )  # fmt: skip
        assert status == 200, completion
        choice = completion["choices"][0]
        chain = _chain(tiny_peaky_mtp_model)
        tokens = choice["prompt_token_ids"][-1:] + choice["token_ids"]
        assert len(choice["token_ids"]) == 48
        assert all(chain[a] == b for a, b in itertools.pairwise(tokens))
        metrics = http(f"{engine_url}/metrics")[1].decode()
        drafted = _metric(metrics, "vllm:spec_decode_num_draft_tokens_total")
        accepted = _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafted >= 30, metrics[:2000]
        assert accepted / drafted >= 0.9
        warden.send_signal(signal.SIGTERM)
        assert warden.wait(timeout=90) == 0
    finally:
        if warden.poll() is None:
            warden.send_signal(signal.SIGTERM)
            warden.wait(timeout=90)
        log.close()


def _serve(profile: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """`warden run PROFILE`, ready (or exited: the caller's assertion shows the log)."""
    data = yaml.safe_load(profile.read_text())
    api = f"http://127.0.0.1:{data['api']['port']}"
    with log_path.open("wb") as log:
        warden = subprocess.Popen([*WARDEN, "run", str(profile)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: _snapshot(api)["state"] == "ready" or warden.poll() is not None, timeout_s=240, what="ready")
    assert warden.poll() is None, log_path.read_text()
    return warden


def _color_answers_match(profile: Path, reference: Path) -> None:
    """`warden canary` of the color suite, 2 repeats: every answer is the reference's, token for token."""
    same = _canary("--profile", str(profile), "--suite", "color", "--repeats", "2", "--reference", str(reference))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "color  16/16 against the reference" in same.stdout


def _stop(warden: subprocess.Popen[bytes]) -> None:
    if warden.poll() is None:
        warden.send_signal(signal.SIGTERM)
        assert warden.wait(timeout=90) == 0


def _canary(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WARDEN, "canary", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip


def test_mtp_against_no_spec_with_the_canary_and_the_benchmark(
    tmp_path: Path, tiny_peaky_mtp_model: Path, tiny_peaky_blurred_mtp_model: Path
) -> None:
    """The seeds' way to judge speculative decoding, at the tiny scale, on one model served three times.
    Canary ("color 96/96 vs no-spec"): the answers without speculation become the reference; with MTP k=3 the same
    tokens come back; a reference with one token changed is a mismatch naming the case, the repeat and the token.
    Benchmark: each engine's result carries its supervisor's identity; `bench compare` refuses the pair until the
    differences are named with --vary, then gives the ratio.
    ReplaySSM (the third serve, an MTP layer that misses some successors, so windows are rolled back): MTP k=3 with
    the GDN verify on ReplaySSM answers as no-spec did, its rings fold, and every verify agrees with vLLM's own
    (the shadow check). The fourth serve: no speculation, the GDN decode on ReplaySSM, the same checks."""
    profile, data = write_profile(tmp_path, tiny_peaky_mtp_model)
    # a short model length, so that a request runs to it quickly: its last windows are trimmed to what is left
    data["engine"]["args"] = [a for a in data["engine"]["args"] if not a.startswith("--max-model-len")]
    data["engine"]["args"].append(f"--max-model-len={MODEL_LEN}")
    profile.write_text(yaml.safe_dump(data))
    reference = tmp_path / "no-spec.json"
    warden = _serve(profile, tmp_path / "warden-no-spec.log")
    try:
        made = _canary("--profile", str(profile), "--repeats", "2", "--out", str(reference))
        assert made.returncode == 0, made.stdout + made.stderr
        assert "json   16/16 against the first repeat" in made.stdout
        assert "color  16/16 against the first repeat" in made.stdout and "result: ok" in made.stdout
        bench = _bench(profile, tmp_path / "no-spec-bench.json")
        api = f"http://127.0.0.1:{data['api']['port']}"
        assert bench["identity"] == http_json(f"{api}/identity")[1]
        assert bench["placement"] == _snapshot(api)["placement"]
    finally:
        _stop(warden)

    data["speculative"] = {"method": "mtp", "num_speculative_tokens": 3}
    data["engine"]["args"].append("--no-enable-prefix-caching")  # spec + prefix caching crashes the CPU build
    profile.write_text(yaml.safe_dump(data))
    warden = _serve(profile, tmp_path / "warden-mtp.log")
    try:
        api = f"http://127.0.0.1:{data['api']['port']}"
        findings = {f["rule"]: f for f in _snapshot(api)["guard"]["findings"]}  # the noteworthy ones
        assert "cpu-spec-structured-outputs" not in findings  # passed: with warden's spec conv, grammars work
        same = _canary("--profile", str(profile), "--repeats", "2", "--reference", str(reference))
        assert same.returncode == 0, same.stdout + same.stderr
        assert "json   16/16 against the reference" in same.stdout
        assert "color  16/16 against the reference" in same.stdout
        # all drafts accepted, then windows trimmed to the model length: vLLM as shipped dies here
        # (num_accepted_tokens must be in [1, seqlen]); with warden's spec conv the request ends at the limit
        chain = _chain(tiny_peaky_mtp_model)
        engine_url = f"http://127.0.0.1:{data['engine']['port']}"
        _follows_chain(engine_url, chain, list(range(30, 40)), max_tokens=MODEL_LEN - 10)
        assert _snapshot(api)["launches"] == 1

        stored = json.loads(reference.read_text())
        tokens = stored["suites"]["color"]["color-3"]["tokens"]
        tokens[5] += 1
        changed = tmp_path / "changed.json"
        changed.write_text(json.dumps(stored))
        differs = _canary("--profile", str(profile), "--suite", "color", "--repeats", "1", "--reference", str(changed))
        assert differs.returncode == 3, differs.stdout + differs.stderr
        assert "color  7/8 against the reference" in differs.stdout and "result: MISMATCH" in differs.stdout
        assert f"color-3 repeat 0: token 5 is {tokens[5] - 1}, expected {tokens[5]}" in differs.stdout

        _bench(profile, tmp_path / "mtp-bench.json")
        pair = [str(tmp_path / "no-spec-bench.json"), str(tmp_path / "mtp-bench.json")]
        refused = subprocess.run([*WARDEN, "bench", "compare", *pair], cwd=REPO, capture_output=True, text=True,
                                 timeout=60, check=False)  # fmt: skip
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "not comparable" in refused.stdout and "differs: speculative: null -> " in refused.stdout
        assert "differs: engine_args.enable_prefix_caching" in refused.stdout
        vary = ["--vary", "speculative", "--vary", "engine_args.enable_prefix_caching"]
        compared = subprocess.run([*WARDEN, "bench", "compare", *pair, *vary], cwd=REPO, capture_output=True,
                                  text=True, timeout=60, check=False)  # fmt: skip
        assert compared.returncode == 0, compared.stdout + compared.stderr
        assert "differ only in what --vary names (2 field(s)): B/A decode " in compared.stdout
    finally:
        _stop(warden)

    # ReplaySSM takes over the GDN layers' verify, and vLLM's own verify runs beside it (the shadow check). A step's
    # token budget of 9 holds two windows of 4 and one of 1: the scheduler trims the third row's drafts to none
    data["replayssm"] = {"enabled": True, "ring_len": 8, "shadow_check": True}
    data["model"]["path"] = str(tiny_peaky_blurred_mtp_model)  # the same main weights: the reference holds
    data["engine"]["args"].append("--max-num-batched-tokens=9")
    profile.write_text(yaml.safe_dump(data))
    warden = _serve(profile, tmp_path / "warden-replayssm.log")
    try:
        api = f"http://127.0.0.1:{data['api']['port']}"
        replayssm = http_json(f"{api}/identity")[1]["identity"]["replayssm"]
        assert replayssm == {"enabled": True, "ring_len": 8, "shadow_check": True}
        engine_url = f"http://127.0.0.1:{data['engine']['port']}"
        _burst(engine_url, tiny_peaky_blurred_mtp_model)  # rows verified together
        # alone, so that no row has drafts: a one-token prompt, and one whose last prefill chunk is a single token
        chain = _chain(tiny_peaky_blurred_mtp_model)
        _follows_chain(engine_url, chain, [5], max_tokens=8)
        _follows_chain(engine_url, chain, list(range(10, 20)), max_tokens=8)  # chunks of 9 and 1
        _follows_chain(engine_url, chain, list(range(30, 41)), max_tokens=MODEL_LEN - 11)  # to the model length
        assert _snapshot(api)["launches"] == 1
        _color_answers_match(profile, reference)
        metrics = http(f"http://127.0.0.1:{data['engine']['port']}/metrics")[1].decode()
        drafted = _metric(metrics, "vllm:spec_decode_num_draft_tokens_total")
        accepted = _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafted >= 100 and 0.1 <= accepted / drafted <= 0.9, (accepted, drafted)  # rejections: rollbacks
        engine_log = (tmp_path / "state" / "tiny-cpu" / "engine.log").read_text()
        assert (
            "GDN ReplaySSM: vLLM's CPU GDN decode and spec verify run on the ReplaySSM reference (ring of 8"
            in engine_log
        )
        assert "GDN ReplaySSM: first checkpoint fold" in engine_log  # the rings filled and folded while serving
        assert "GDN ReplaySSM: first spec row without drafts" in engine_log  # a window of 1 beside full ones
        summaries = re.findall(SHADOW_SUMMARY, engine_log)
        assert summaries and int(summaries[-1][0]) >= 64, engine_log[-3000:]  # every layer's verifies, compared
        assert int(summaries[-1][3]) >= 2, summaries[-1]  # the burst's requests shared verify steps
        assert all(s[2] == "0" for s in summaries) and "differ from vLLM's" not in engine_log
        warden_metrics = http(f"{api}/metrics")[1].decode()
        assert "\nwarden_replayssm_shadow_mismatches_total 0.0\n" in warden_metrics  # watched, and none seen
    finally:
        _stop(warden)

    # Without speculation ReplaySSM takes the GDN decode: a record per token, a fold when the ring is full
    data["speculative"] = None
    data["engine"]["args"].remove("--max-num-batched-tokens=9")
    data["replayssm"] = {"enabled": True, "ring_len": 4, "shadow_check": True}
    data["model"]["path"] = str(tiny_peaky_mtp_model)
    profile.write_text(yaml.safe_dump(data))
    warden = _serve(profile, tmp_path / "warden-replayssm-decode.log")
    try:
        _color_answers_match(profile, reference)
        engine_log = (tmp_path / "state" / "tiny-cpu" / "engine.log").read_text()
        this_launch = engine_log[engine_log.rindex("GDN ReplaySSM: vLLM's CPU GDN decode and spec verify run") :]
        assert "ring of 4" in this_launch.splitlines()[0]
        assert "first decode step" in this_launch and "first checkpoint fold" in this_launch
        summaries = re.findall(SHADOW_SUMMARY, this_launch)
        assert summaries and summaries[-1][0] == "0" and int(summaries[-1][1]) >= 64, this_launch[-3000:]
        assert all(s[2] == "0" for s in summaries) and "differ from vLLM's" not in this_launch
    finally:
        _stop(warden)


MODEL_LEN = 128  # the MTP test's --max-model-len (the bench asks 48 tokens after a ~70-token prompt)

# the shadow check's summary line: verify calls, decode calls, calls over tolerance, widest batch
SHADOW_SUMMARY = r"shadow check: (\d+) verify calls, (\d+) decode calls, (\d+) over tolerance.*batch (\d+) rows"


def _chain(model: Path) -> list[int]:
    """The peaky model's greedy successor of each token (`warden model tiny --peaky` writes it)."""
    return json.loads((model / "perm.json").read_text())["next_token_of"]


def _follows_chain(engine_url: str, chain: list[int], prompt: str | list[int], max_tokens: int) -> None:
    """A greedy completion (`prompt` as text or token ids) that answers in full and follows the peaky model's
    chain."""
    request = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    status, body = http_json(f"{engine_url}/v1/completions", request)
    assert status == 200, (prompt, body)
    choice = body["choices"][0]
    tokens = choice["prompt_token_ids"][-1:] + choice["token_ids"]
    assert len(tokens) == max_tokens + 1 and all(chain[a] == b for a, b in itertools.pairwise(tokens)), prompt


def _burst(engine_url: str, model: Path, requests: int = 6) -> None:
    """Concurrent greedy completions, so that the engine batches them (prefills beside verifies included); each
    must still follow the peaky model's chain."""
    chain = _chain(model)
    prompts = [f"Request {i} asks about devices that fail in quiet ways" for i in range(requests)]
    with ThreadPoolExecutor(max_workers=requests) as pool:
        list(pool.map(lambda prompt: _follows_chain(engine_url, chain, prompt, 32), prompts))


def _bench(profile: Path, out: Path) -> dict:
    argv = [*WARDEN, "bench", "--profile", str(profile), "--runs", "2", "--max-tokens", "48", "--out", str(out)]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    bench = json.loads(out.read_text())
    assert [run["tokens"] for run in bench["runs"]] == [48, 48]
    assert all(run["decode_tokens_per_s"] > 0 and run["ttft_s"] > 0 for run in bench["runs"])
    return bench
