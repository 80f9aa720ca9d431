"""Where the time goes: per test set, loading vs forward vs writing, worker utilisation, what bounds it."""

from __future__ import annotations

from espnet3_prefect.pipeline.report import add_timing, bound_by, empty_timing, format_summary, summary_rows


def _summary(timing, workers=2, shards_run=2):
    return {
        "test_set": "test_clean",
        "shards": 2,
        "shards_run": shards_run,
        "shards_cached": 2 - shards_run,
        "items": 100,
        "failed": 0,
        "seconds": 5.0,
        "workers": workers,
        "timing": timing,
        "outputs": {},
    }


def test_shard_timings_add_up_per_test_set_and_show_in_the_table_and_the_terminal():
    total = empty_timing()
    for load in (4.0, 4.5):
        add_timing(
            total,
            {
                "seconds": 4.0,
                "timing": {"load_s": load, "wait_s": 0.25, "forward_s": 3.0, "write_s": 0.5, "prefetch": 2},
            },
        )
    total["wall_s"] = 4.2
    [row] = summary_rows([_summary(total)])
    assert (row["load_s"], row["wait_s"], row["forward_s"], row["write_s"]) == (8.5, 0.5, 6.0, 1.0)
    assert row["utilisation"] == round(8.0 / (2 * 4.2), 3) and row["bound"] == "data loading"
    text = format_summary([_summary(total)])
    assert (
        "time in shards: load 8.5 s (waited 0.5 s), forward 6.0 s, write 1.0 s; workers 95% busy; "
        "bound by data loading" in text
    )


def test_model_bound_writing_bound_and_unmeasured_loading():
    assert bound_by({"busy_s": 1, "load_s": 1.0, "forward_s": 3.0, "write_s": 0.1}) == "model"
    assert bound_by({"busy_s": 1, "load_s": 0.1, "forward_s": 0.2, "write_s": 2.0}) == "writing"
    unmeasured = add_timing(
        empty_timing(), {"seconds": 2.0, "timing": {"load_s": None, "wait_s": 0.0, "forward_s": 1.8, "write_s": 0.1}}
    )
    unmeasured["wall_s"] = 2.0
    [row] = summary_rows([_summary(unmeasured, workers=1, shards_run=1)])
    assert row["load_s"] is None and row["bound"] == "model" and row["utilisation"] == 1.0
    assert "forward 1.8 s (item reads included)" in format_summary([_summary(unmeasured, 1, 1)])


def test_a_finished_stage_that_ran_nothing_shows_no_timing():
    [row] = summary_rows([_summary(None, workers=0, shards_run=0)])
    assert row["bound"] == "" and row["utilisation"] is None and row["load_s"] is None
    assert "time in shards" not in format_summary([_summary(None, workers=0, shards_run=0)])


def test_rates_count_only_the_items_of_shards_that_ran():
    cached = _summary(None, workers=0, shards_run=0)
    assert summary_rows([cached])[0]["items_per_s"] is None
    assert format_summary([cached]).splitlines()[0] == "test_clean: 100 items, 0 shards run, 2 cached, 5.0 s"
    half = {**_summary(None, shards_run=1), "items_run": 50}
    assert summary_rows([half])[0]["items_per_s"] == 10.0
    assert "1 shards run, 1 cached, 5.0 s (10.0 items/s)" in format_summary([half])


def test_a_waveform_stage_reports_audio_seconds_and_costs():
    """TTS: the unit is the audio second; wall seconds per item and per second of output."""
    summary = {"test_set": "test", "shards": 2, "shards_run": 2, "shards_cached": 0, "items": 4, "items_run": 4}
    summary.update(seconds=10.0, generated_s=4.0, workers=2, timing=None)
    [row] = summary_rows([summary])
    assert (row["generated_s"], row["s_per_item"], row["s_per_generated_s"]) == (4.0, 2.5, 2.5)
    assert "audio: 4.0 s generated; 2.5 s per item, 2.5 s per second of output" in format_summary([summary])


def test_an_asr_stage_has_no_audio_line():
    summary = {"test_set": "test", "shards": 1, "shards_run": 1, "shards_cached": 0, "items": 4}
    summary.update(seconds=1.0, workers=1, timing=None)
    [row] = summary_rows([summary])
    assert "generated_s" not in row and "audio:" not in format_summary([summary])
