"""`make bench` prints a regression line for a guarded figure worse than the last run's."""

from __future__ import annotations

from bench import harness
from bench.harness import COUNT, WALL, Guard, Section


def _section(name: str, *figures: tuple[str, float | None, str, Guard | None]) -> Section:
    section = Section(title=name, name=name)
    for figure, value, unit, guard in figures:
        section.add(figure, value, unit, guard=guard)
    return section


def test_figures_read_back_from_the_results_file_as_written() -> None:
    written = _section(
        "speed",
        ("[vCenter] scale-up: 50 Agents prepared", 38.5, "s", WALL),
        ("[vCenter]   API writes per prepared VM", 7.86, "writes", COUNT),
        ("vSphere requests", 1462, "requests", None),
        ("not measured", None, "s", WALL),
    )
    text = harness.merge("", [written], order=["speed"])
    assert harness.recorded(text) == {
        ("speed", "[vCenter] scale-up: 50 Agents prepared"): 38.5,
        ("speed", "[vCenter]   API writes per prepared VM"): 7.86,
        ("speed", "vSphere requests"): 1462,
    }


def test_the_committed_results_parse() -> None:
    figures = harness.recorded(harness.RESULTS.read_text())
    assert ("capacity", "API writes per VM") in figures
    assert ("memory", "RSS, steady, caches synced") in figures


def test_only_a_guarded_figure_worse_than_its_band_is_a_regression() -> None:
    before = harness.merge(
        "",
        [
            _section(
                "memory",
                ("RSS, steady", 140.0, "MB", None),
                ("start to caches synced", 6.0, "s", None),
                ("writes per VM", 8.0, "writes", None),
                ("prepared", 200, "of 200", None),
            )
        ],
        order=["memory"],
    )
    now = _section(
        "memory",
        ("RSS, steady", 200.0, "MB", None),  # not guarded: never reported
        ("start to caches synced", 13.0, "s", WALL),  # +117%: reported
        ("writes per VM", 8.3, "writes", COUNT),  # +3.75%: inside its 5% band
        ("prepared", 150, "of 200", Guard(0.0, higher_is_better=True)),  # fewer: reported
        ("new figure", 1.0, "s", WALL),  # nothing to compare with
    )
    assert harness.regressions(before, [now]) == [
        "regression: memory: start to caches synced 6 -> 13 s (+117%; noise band 20%)",
        "regression: memory: prepared 200 -> 150 of 200 (-25%; noise band 0%)",
    ]


def test_better_is_never_a_regression() -> None:
    assert not WALL.regressed(13.0, 6.0)
    assert not Guard(0.1, higher_is_better=True).regressed(100, 180)
    assert Guard(0.1, higher_is_better=True).regressed(100, 80)
