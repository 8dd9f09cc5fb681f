"""``shapeplan bench --serve URL``: streaming clients against the test server report every request's
tokens, no errors, TTFT/ITL percentiles, a JSON file and (with matplotlib) the plot."""
from __future__ import annotations

import importlib.util
import json

from shapeplan.cli import main


def test_bench_serve_reports_each_concurrency(server, tmp_path, capsys):
    out = tmp_path / "serve.json"
    rc = main(["bench", "--serve", server.url + "/v1", "--concurrency", "1,4", "--prompt-len", "16",
               "--new-tokens", "8", "--requests", "6", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["concurrency"] for r in rows] == [1, 4] and all(r["requests"] == 6 for r in rows)
    for r in rows:
        assert r["ok"] and r["extra"]["errors"] == 0
        assert r["output_tok_s"] > 0 and r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] > 0
        assert r["prefill_tokens"] >= 6 * 16 - 16            # from the server's /metrics
    text = capsys.readouterr()
    assert "out tok/s" in text.out and "stream tok/s" in text.out
    assert (tmp_path / "serve.png").exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_bench_serve_counts_refused_requests_as_errors(small_server, tmp_path, capsys):
    out = tmp_path / "x.json"
    rc = main(["bench", "--serve", small_server.url, "--concurrency", "2", "--prompt-len", "2000", "--new-tokens", "4",
               "--requests", "3", "--api-key", "sk-test-key", "--json", str(out)])
    assert rc == 1
    row = json.loads(out.read_text())["rows"][0]
    assert row["extra"]["errors"] == 3 and "HTTP 400" in row["error"]
    assert main(["bench", "--serve", small_server.url, "--api-key", "wrong"]) == 1
    assert "no OpenAI-compatible server answers" in capsys.readouterr().err
