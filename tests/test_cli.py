"""The ``throttlekit`` command line, end to end: each command runs in a subprocess.

``demo`` runs its own local sites; ``fetch`` runs against the recording
multi-host server of ``tests/_server.py`` (used as the fetcher's HTTP proxy, so
every host is its own throttling scope), and the assertions about throttling
are made from what that server recorded.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _server import Hang, LocalServer, RateLimited, Reply

from throttlekit.__main__ import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_cli(
    *args: str | Path, cwd: Path | None = None, timeout: float = 90, code: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m throttlekit ARGS`` (or ``python -c CODE ARGS``), with a wide, plain console."""
    env = {**os.environ, "COLUMNS": "160", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    env.pop("FORCE_COLOR", None)
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "throttlekit"]
    return subprocess.run(
        [*command, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
        check=False,
    )


def prose(output: str) -> str:
    """``output`` with its wrapped prose joined back: the commands wrap their
    sentences at 80 columns, continuing each on lines indented by 4 spaces."""
    return re.sub(r"\n {4}(?=\S)", " ", output)


def table_row(output: str, first_cell: str) -> list[str]:
    """The cells of the table row that starts with ``first_cell``.

    Cells are separated by box lines, or by two spaces or more in borderless tables.
    """
    for line in output.splitlines():
        stripped = line.strip().strip("│┃").strip()
        separator = "[│┃]" if re.search("[│┃]", stripped) else " {2,}"
        cells = [cell.strip() for cell in re.split(separator, stripped)]
        if len(cells) > 3 and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row {first_cell!r} in:\n{output}")


# -- simulate -------------------------------------------------------------------------


def test_simulate_prints_summary_and_charts_writes_png_and_trace(tmp_path: Path) -> None:
    plot, trace = tmp_path / "run.png", tmp_path / "trace.jsonl"
    result = run_cli(
        "simulate",
        "--server", "quota:limit=5,window=1,retry_after=2",
        "--concurrency", "2",
        "--delay", "0",
        "--set", "RANDOMIZE_DOWNLOAD_DELAY=false",
        "--requests", "400",
        "--duration", "60",
        "--plot", plot,
        "--trace", trace,
        "--check",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = prose(result.stdout)
    assert "workload: 400 requests queued at t=0" in out
    assert "site.test: quota(retry_after=2)" in out
    assert "policy: concurrency 2, delay 0 s, slot delay 0 s, controllers: backoff" in out
    assert "check passed" in out
    for series in ("sent/s", "ok/s", "429/s", "errors/s", "delay s"):
        assert series in out
    assert re.search(r"[▁▂▃▄▅▆▇█]{40,}", out)

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == 400
    sent = [r for r in records if r["sent"] is not None]
    refused = [r for r in sent if r["status"] == 429]
    ok = [r for r in sent if r["status"] == 200]
    assert refused
    assert all(r["headers"] == {"Retry-After": "2"} for r in refused)
    # The summary row agrees with the trace.
    row = table_row(out, "site.test")
    assert row[1:5] == [str(len(sent)), str(len(ok)), str(len(refused)), "0"]
    # No send before a Retry-After elapsed (sends at the very instant are ambiguous).
    for response in refused:
        blocked = [
            r
            for r in sent
            if response["responded"] < r["sent"] < response["responded"] + 2.0 - 1e-9
        ]
        assert blocked == [], (response, blocked[:3])
    # Never more than 2 in flight, never more than 5 accepted per fixed 1 s window.
    events = sorted(
        [(r["sent"], 1) for r in sent] + [(r["released"], -1) for r in sent if r["released"]],
        key=lambda event: (event[0], event[1]),
    )
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    assert peak == 2

    data = plot.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    import matplotlib.image

    image = matplotlib.image.imread(plot)
    assert image.shape[0] > 300
    assert image.shape[1] > 500


def test_simulate_documented_config(capsys: pytest.CaptureFixture[str]) -> None:
    # In process (the subprocess route is covered above): main() is the console script.
    assert main(["simulate", "--config", str(EXAMPLES / "simulate.toml"), "--duration", "60"]) == 0
    out = prose(capsys.readouterr().out)
    assert "spread over 2 sites, 60 s simulated" in out
    assert "api.test: quota(retry_after=2)" in out
    assert "policy: concurrency 2," in out  # THROTTLING_SCOPES["api.test"]
    assert "shop.test: capacity(workers=2, service_time=0.25)" in out
    assert "policy: concurrency 4," in out
    api, shop = table_row(out, "api.test"), table_row(out, "shop.test")
    total = table_row(out, "all")
    assert int(total[1]) == int(api[1]) + int(shop[1])
    # The shop serves 8 requests/s at most, the API 5.
    assert float(shop[5]) <= 8.0
    assert float(api[5]) <= 5.0


def test_simulate_defaults_show_throttling_at_work(capsys: pytest.CaptureFixture[str]) -> None:
    """With no options, the policy sends faster than the server allows: backoff has work."""
    assert main(["simulate", "--duration", "120"]) == 0
    out = prose(capsys.readouterr().out)
    assert "policy: concurrency 8, delay 0 s, slot delay 0 s" in out
    row = table_row(out, "site.test")
    assert int(row[3]) > 0  # some 429s
    assert int(row[9]) > 0  # backoff stepped in
    # And it settles: most requests are answered.
    assert int(row[2]) > 0.9 * int(row[1])


def test_plot_reference_line_is_what_the_server_allows() -> None:
    from throttlekit._cli._charts import allowed_rate
    from throttlekit.testing import CapacityServer, FixedServer, QuotaServer

    quota = QuotaServer(limit=5, window=2.0, changes=[(100.0, 10)])
    assert allowed_rate(quota, [0.0, 99.0, 100.0]) == [2.5, 2.5, 5.0]
    assert allowed_rate(CapacityServer(workers=2, service_time=0.25), [0.0]) == [8.0]
    assert allowed_rate(FixedServer(), [0.0]) is None
    assert allowed_rate(None, [0.0]) is None


def test_simulate_without_backoff_gets_more_429s(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--server", "quota:limit=5,retry_after=1", "--concurrency", "4",
            "--delay", "0", "--duration", "30", "--requests", "500"]  # fmt: skip
    assert main(args) == 0
    polite = capsys.readouterr().out
    assert main([*args, "--no-backoff"]) == 0
    blunt = capsys.readouterr().out
    polite_429 = int(table_row(polite, "site.test")[3])
    blunt_429 = int(table_row(blunt, "site.test")[3])
    assert blunt_429 > 10 * max(1, polite_429)
    assert "controllers: none" in blunt


def test_simulate_arrival_rate_several_sites_and_autothrottle(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    args = ["simulate", "--rate", "8", "--requests", "300", "--duration", "60", "--delay", "0",
            "--site", "cdn.test=cdn:hit_ratio=1.0", "--site", "shop.test=capacity:workers=1",
            "--autothrottle", "--set", "AUTOTHROTTLE_START_DELAY=0.5",
            "--trace", str(trace)]  # fmt: skip
    assert main(args) == 0
    out = prose(capsys.readouterr().out)
    assert "requests arriving at 8/s on average (Poisson), at most 300, spread over 2 sites" in out
    assert "controllers: backoff, autothrottle" in out
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == 300
    arrivals = [r["arrived"] for r in records]
    assert arrivals == sorted(arrivals)
    assert 20 < max(arrivals) < 60  # 300 arrivals at 8/s: about 37 s
    assert {r["url"].split("/")[2] for r in records} == {"cdn.test", "shop.test"}
    cdn, shop = table_row(out, "cdn.test"), table_row(out, "shop.test")
    # AutoThrottle keeps the slow shop's delay near its latency; the CDN's near 0.
    assert float(shop[6].split()[0]) > float(cdn[6].split()[0])


def test_simulate_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """At 80 columns nothing is cut (a boxed summary squeezed its labels to
    "settl…") and the prose wraps at words."""
    monkeypatch.setenv("COLUMNS", "80")
    args = ["--site", "api.test=quota", "--site", "www.shop.example.test=flaky"]
    assert main(["simulate", *args, "--requests", "300", "--duration", "30"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    summary = out[out.index("summary") : out.index("over time")]
    assert "\u2026" not in summary, summary  # a long scope name folds instead
    assert table_row(summary, "scope")[-4:] == ["delay", "delay", "settled", "backoff"], out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server", "quota2"], "unknown server model 'quota2' (did you mean 'quota'?)"),
        (["--server", "quota:limt=5"], "server 'quota' has no parameter 'limt'"),
        (["--server", "quota:limit=0"], "server 'quota': limit must be an int >= 1"),
        (["--server", "bucket:capacity=0"], "server 'bucket': capacity must be an int >= 1"),
        (["--set", "DOWNLOAD_DELY=1"], "unknown setting 'DOWNLOAD_DELY' (did you mean"),
        (["--set", "DOWNLOAD_DELAY=-1"], "delay must be a finite number >= 0"),
        (["--set", "nothing"], "--set expects KEY=VALUE"),
        (["--site", "api.test"], "--site expects HOST=SERVER"),
        (["--duration", "0"], "duration must be > 0"),
        (["--config", "missing.toml"], "config file 'missing.toml' does not exist"),
    ],
)
def test_simulate_reports_bad_usage_with_exit_code_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In process, for speed: main() is what the console script runs.
    assert main(["simulate", *args]) == 2
    captured = capsys.readouterr()
    assert message.lower() in captured.err.lower()
    assert captured.out == ""


def test_simulate_reports_bad_config_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("DOWNLOAD_DELAY = [\n")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[simulate]\nduraton = 5\n")
    typed = tmp_path / "typed.toml"
    typed.write_text('[simulate]\nduration = "long"\n')
    for path, message in (
        (unknown, "[simulate] has unknown key 'duraton'"),
        (typed, "duration must be a number"),
    ):
        assert main(["simulate", "--config", str(path)]) == 2
        assert message in capsys.readouterr().err
    # Usage errors of the command-line parser too: one line, as cli.rst says.
    for args, message in (
        (["simulate", "--concurrency", "many"], "error: invalid value for '--concurrency': "),
        (["simulate", "--server-for", "x"], "error: no such option: --server-for"),
        (["simulat"], "error: no such command 'simulat'"),
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(message), err
        assert err.count("\n") == 1, err
        assert err.endswith(" --help\n"), err
    # And once through a real process: exit code 2, one line, no traceback.
    result = run_cli("simulate", "--config", broken)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: config file '{broken}' is not valid TOML")
    assert "Traceback" not in result.stderr


def test_missing_extras_are_reported_with_the_install_hint(tmp_path: Path) -> None:
    block = "import sys; sys.modules[{name!r}] = None; from throttlekit.__main__ import main; "
    no_plot = run_cli(
        "simulate", "--plot", tmp_path / "x.png",
        code=block.format(name="matplotlib") + "sys.exit(main(sys.argv[1:]))",
    )  # fmt: skip
    assert no_plot.returncode == 2
    assert 'pip install "throttlekit-http[plot]"' in no_plot.stderr
    assert not (tmp_path / "x.png").exists()
    no_typer = run_cli("simulate", code=block.format(name="typer") + "sys.exit(main(['--help']))")
    assert no_typer.returncode == 2
    hint = 'needs typer, which is not installed: pip install "throttlekit-http[cli]"'
    assert hint in no_typer.stderr


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("simulate", "demo", "fetch"):
        assert command in out
    assert not re.search(r"^  (simulate|demo|fetch) .*\.\.\.$", out, re.M)  # help lines whole
    assert main(["frobnicate"]) == 2


def test_version() -> None:
    from throttlekit import __version__

    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"throttlekit {__version__}\n"


def test_help_shows_bracketed_words_and_is_not_cut() -> None:
    """No markup eats "[simulate]" or "throttlekit-http[plot]"; long lines wrap, never cut."""
    result = run_cli("simulate", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "a [simulate] table" in text
    assert "(needs throttlekit-http[plot])" in text
    assert "Limiter.from_settings reads" in text
    assert "\u2026" not in result.stdout  # no ellipsis: nothing cut short
    assert max(len(line) for line in result.stdout.splitlines()) <= 120


# -- demo -------------------------------------------------------------------------------


def test_demo_crawls_local_sites_and_reports() -> None:
    result = run_cli("demo", "--duration", "4", timeout=60)
    assert result.returncode == 0, result.stderr
    # Its prose fits an 80-column terminal, wrapped at words, each paragraph's
    # lines after the first indented by four spaces: join them back to read.
    assert max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
    out = prose(result.stdout.split("after ", 1)[1])
    out = result.stdout.split("after ", 1)[0] + "after " + out
    assert "8 workers per site crawl for 4 s through httpx + throttlekit" in out
    assert "(Adaptive's words: 'throttled at' is" in out or " edge " not in out
    rows = {host: table_row(out, host) for host in ("fast.test", "slow.test", "quota.test",
                                                    "flaky.test")}  # fmt: skip
    header = table_row(out, "site")
    assert header == ["site", "in flight", "delay", "backoff", "ok", "ok/s", "429", "5xx",
                      "failed", "latency"]  # fmt: skip
    assert int(rows["fast.test"][4]) > int(rows["slow.test"][4]) > 0
    assert int(rows["quota.test"][4]) > 0
    # The report says what each site saw: never more than the policy's ceiling of 8 at once.
    for host in rows:
        match = re.search(rf"^{re.escape(host)}: (\d+) ok .* at most (\d+) requests? at once", out,
                          re.MULTILINE)  # fmt: skip
        assert (match.group(2) == "1") == (" at most 1 request at once" in match.group(0)), out
        assert match, out
        # flaky.test hangs on 2 %: a request the client timed out frees its
        # slot while the site still holds it, so the site may see more.
        assert 1 <= int(match.group(2)) <= (12 if host == "flaky.test" else 8)
    # Each site: what it does, the policy applied, and what the limiter did and why.
    assert out.count("throttlekit applies: concurrency 8, delay 0 s") == 4, out
    assert out.count("backoff, adaptive") == 4, out
    explanations = re.findall(r"^  (.+): this site (.+)\.$", out, re.MULTILINE)
    assert len(explanations) == 4, out
    assert all(explanation.startswith("Adaptive ") for explanation, _ in explanations), out
    assert re.search(r"^done in \d+\.\d s$", out, re.MULTILINE)


def test_demo_rejects_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "demo.toml"
    config.write_text("CONCURRENT_REQUESTS_PER_DOMAIN = 0\n")
    assert main(["demo", "--config", str(config), "--duration", "1"]) == 2
    assert "concurrency must be >= 1" in capsys.readouterr().err


# -- fetch ------------------------------------------------------------------------------


def configure(local: LocalServer) -> None:
    """Forget what the server recorded and give it the test sites."""
    local.reset()
    local.route("a.test", behaviour=Reply(latency=0.02, body=b"a" * 100))
    local.route("b.test", behaviour=Reply(latency=0.02, body=b"b" * 200))
    local.route("c.test", behaviour=RateLimited(limit=1, window=1.0))
    local.route("down.test", behaviour=Reply(status=503, body=b"down"))
    local.route("hang.test", behaviour=Hang())
    local.route("a.test", "/missing", Reply(status=404, body=b"no"))


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with LocalServer() as local:
        configure(local)
        yield local


def write_urls(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_fetch_is_polite_per_host_and_resumable(tmp_path: Path, server: LocalServer) -> None:
    urls = [f"http://a.test/page/{n}" for n in range(4)] + [
        f"http://b.test/page/{n}" for n in range(4)
    ]
    urls_file = write_urls(tmp_path / "urls.txt", ["# two hosts", "", *urls, urls[0]])
    config = tmp_path / "fetch.toml"
    config.write_text("RANDOMIZE_DOWNLOAD_DELAY = false\n[fetch]\nretries = 1\n")
    output = tmp_path / "out.jsonl"
    args = ("fetch", urls_file, "-o", output, "--config", config, "--proxy", server.proxy_url,
            "--per-host", "1", "--delay", "0.3", "--concurrency", "8")  # fmt: skip
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert "fetched 8 URL(s)" in first.stderr
    assert (
        "8 ok, 0 answered 4xx (final, not retried), 0 failed; 0 already in the output, "
        "0 bad line(s)" in first.stderr
    )

    records = read_jsonl(output)
    assert sorted(r["url"] for r in records) == sorted(urls)  # the duplicate line is dropped
    by_url = {r["url"]: r for r in records}
    assert by_url["http://a.test/page/0"]["bytes"] == 100
    assert by_url["http://b.test/page/1"]["bytes"] == 200
    for record in records:
        assert set(record) == {"url", "status", "bytes", "scope", "latency", "waited",
                               "elapsed", "attempts", "error", "fetched_at"}  # fmt: skip
        assert record["status"] == 200
        assert record["scope"] == str(record["url"]).split("/")[2]
        assert record["attempts"] == 1
    # fetched_at is when each request was sent: one host's sends are 0.3 s apart.
    for host in ("a.test", "b.test"):
        sent = sorted(
            datetime.datetime.fromisoformat(r["fetched_at"]) for r in records if r["scope"] == host
        )
        assert all(b - a >= datetime.timedelta(seconds=0.25) for a, b in itertools.pairwise(sent))
        assert record["error"] is None
    # Throttled per host, from the server's own records: one at a time, 0.3 s apart...
    for host in ("a.test", "b.test"):
        assert server.max_in_flight(host) == 1
        assert len(server.hits(host)) == 4
        assert min(server.gaps(host)) >= 0.3 - 0.02
    # ...but the two hosts in parallel, not one after the other.
    assert abs(server.hits("a.test")[0].arrived - server.hits("b.test")[0].arrived) < 0.25
    assert max(r["waited"] for r in records) >= 0.85  # the 4th request of a host waited 0.9 s

    # Resume: the same URLs plus two new ones; only the new ones are fetched.
    configure(server)
    new = ["http://a.test/page/new", "http://b.test/page/new"]
    write_urls(urls_file, [*urls, *new])
    second = run_cli(*args)
    assert second.returncode == 0, second.stderr
    assert (
        "2 ok, 0 answered 4xx (final, not retried), 0 failed; 8 already in the output"
        in second.stderr
    )
    assert sorted(hit.path for hit in server.hits()) == ["/page/new", "/page/new"]
    assert len(read_jsonl(output)) == 10


def test_fetch_reports_bad_lines_and_failures(tmp_path: Path, server: LocalServer) -> None:
    lines = [
        "http://a.test/ok",
        "ftp://a.test/file",
        "not a url",
        "http://c.test/1",
        "http://c.test/2",
        "http://a.test/missing",
        "http://down.test/x",
        "http://hang.test/x",
        "https://",
    ]
    urls_file = write_urls(tmp_path / "urls.txt", lines)
    output = tmp_path / "out.jsonl"
    args = ("fetch", urls_file, "-o", output, "--proxy", server.proxy_url, "--delay", "0",
            "--timeout", "0.5", "--retries", "2", "--per-host", "1")  # fmt: skip
    result = run_cli(*args)
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert f"{urls_file}:2: not an http(s) URL: 'ftp://a.test/file'" in err
    assert f"{urls_file}:3: not a URL (contains spaces): 'not a url'" in err
    assert f"{urls_file}:9: URL without a host: 'https://'" in err
    assert "fetched 6 URL(s)" in err
    # The 404 is an answer (not retried, not a failure), counted apart from the 2xx.
    assert (
        "3 ok, 1 answered 4xx (final, not retried), 2 failed; 0 already in the output, "
        "3 bad line(s)" in err
    )
    by_url = {r["url"]: r for r in read_jsonl(output)}
    assert by_url["http://a.test/missing"]["status"] == 404  # a response: not a failure
    down = by_url["http://down.test/x"]
    assert (down["status"], down["attempts"], down["error"]) == (503, 3, None)
    hang = by_url["http://hang.test/x"]
    assert hang["status"] is None
    assert hang["attempts"] == 3
    assert str(hang["error"]).startswith("ReadTimeout")
    # c.test allows 1 request per second and says "Retry-After: 1" beyond: the
    # fetcher retries no sooner than that, and both URLs end up fetched.
    assert {by_url["http://c.test/1"]["status"], by_url["http://c.test/2"]["status"]} == {200}
    hits = server.hits("c.test")
    assert [hit.status for hit in hits].count(429) >= 1
    for before, after in itertools.pairwise(hits):
        if before.status == 429:
            assert after.arrived - before.arrived >= 1.0 - 0.05
    assert len(server.hits("down.test")) == 3

    # Resume with --retry-failed: only the two failures are fetched again.
    configure(server)
    with output.open("a") as file:
        file.write('{"url": "http://a.test/cut-sho')  # a line cut short by a crash
    again = run_cli(*args, "--retry-failed", "--retries", "0")
    assert again.returncode == 1
    assert "ignored 1 unreadable line(s)" in again.stderr
    assert (
        "0 ok, 0 answered 4xx (final, not retried), 2 failed; 4 already in the output"
        in again.stderr
    )
    assert sorted(hit.host for hit in server.hits()) == ["down.test", "hang.test"]


def test_fetch_interrupted_says_how_to_resume(tmp_path: Path, server: LocalServer) -> None:
    urls_file = write_urls(tmp_path / "urls.txt", [f"http://hang.test/{n}" for n in range(3)])
    output = tmp_path / "out.jsonl"
    env = {**os.environ, "COLUMNS": "160", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "throttlekit", "fetch", str(urls_file), "-o", str(output),
            "--proxy", server.proxy_url, "--timeout", "30"]  # fmt: skip
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not server.hits("hang.test") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.hits("hang.test"), "the fetch never started"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "interrupted: run the same command again to resume" in " ".join(err.split())


def test_fetch_writes_to_stdout_without_output(tmp_path: Path, server: LocalServer) -> None:
    urls_file = write_urls(tmp_path / "urls.txt", ["http://a.test/1", "http://b.test/1"])
    result = run_cli("fetch", urls_file, "--proxy", server.proxy_url, "--delay", "0", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert sorted(json.loads(line)["url"] for line in result.stdout.splitlines()) == [
        "http://a.test/1",
        "http://b.test/1",
    ]


def test_fetch_adaptive_holds_a_hosts_rate_limit(tmp_path: Path, server: LocalServer) -> None:
    server.route("q.test", behaviour=RateLimited(5, 1.0, style="retry-after"))
    urls_file = write_urls(tmp_path / "urls.txt", [f"http://q.test/{n}" for n in range(30)])
    result = run_cli(
        "fetch", urls_file, "--proxy", server.proxy_url, "--per-host", "8", "--delay", "0",
        "--adaptive", "-o", tmp_path / "out.jsonl", "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(r["status"] for r in records) == [200] * 30
    hits = server.hits("q.test")
    refused = sum(1 for hit in hits if hit.status == 429)
    # It slows to the limit instead of retrying into it. In virtual time the
    # same site costs Adaptive one refusal; in real time its sends leave
    # unevenly (a refusal every few seconds while the margin widens): 3-5
    # in runs on a loaded machine, so the bound leaves room for that.
    assert refused <= 6, refused
    assert server.max_in_flight("q.test") <= 8


def test_fetch_documented_config(tmp_path: Path, server: LocalServer) -> None:
    urls_file = write_urls(tmp_path / "urls.txt", [f"http://a.test/{n}" for n in range(3)])
    result = run_cli(
        "fetch", urls_file, "--config", EXAMPLES / "fetch.toml", "--proxy", server.proxy_url,
        "--delay", "0.05", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = read_jsonl(tmp_path / "results.jsonl")  # [fetch] output = "results.jsonl"
    assert len(records) == 3
    assert {hit.headers.get("User-Agent") for hit in server.hits("a.test")} == {
        "my-crawler/1.0 (+https://example.com/bot)"
    }
    assert server.max_in_flight("a.test") <= 2  # CONCURRENT_REQUESTS_PER_DOMAIN = 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.txt"], "URL file 'missing.txt' does not exist"),
        (["URLS", "--per-host", "0"], "invalid value for '--per-host'"),
        (["URLS", "--config", "CONFIG"], "unknown setting 'DOWNLOAD_DELY'"),
        (["URLS", "--timeout", "0"], "timeout must be > 0"),
    ],
)
def test_fetch_reports_bad_usage_with_exit_code_2(
    tmp_path: Path,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    urls_file = write_urls(tmp_path / "urls.txt", ["http://a.test/"])
    config = tmp_path / "bad.toml"
    config.write_text("DOWNLOAD_DELY = 1\n")
    replaced = [
        str(urls_file) if arg == "URLS" else str(config) if arg == "CONFIG" else arg for arg in args
    ]
    monkeypatch.chdir(tmp_path)
    assert main(["fetch", *replaced]) == 2
    assert message in capsys.readouterr().err


def test_describe_policy_names_every_controller() -> None:
    from throttlekit import Adaptive, Limiter, ScopePolicy
    from throttlekit._cli._common import describe_policy

    def my_controller(policy: ScopePolicy) -> object:
        raise AssertionError("not called here")

    policy = ScopePolicy(
        concurrency=None, delay=0.5, adaptive=Adaptive(), controllers=[my_controller]
    )
    limiter = Limiter(scopes={"api.test": policy})
    assert describe_policy(limiter, "api.test") == (
        "concurrency unlimited, delay 0.5 s, slot delay 0 s, "
        "controllers: backoff, adaptive, my_controller"
    )
