"""The event-stream examples on the command line: ``python -m fwdtrain hawkes-2d`` fits and reports."""

from __future__ import annotations

import json

from fwdtrain.cli import app, parser


def test_hawkes_2d_on_the_command_line_reports_estimates_against_the_truth(capsys):
    assert app.main(["hawkes-2d", "--end-time", "600", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["problem"] == "hawkes-2d" and result["events"] > 1_000
    assert {row["name"] for row in result["parameters"]} >= {"decay", "baseline[0]"}
    assert all(row["stderr"] > 0 for row in result["parameters"])
    args, named = parser.parse(["order-book", "--method", "online"])
    assert named and args.method == "online"
    assert app.main(["hawkes-2d", "--method", "grid"]) == 2
