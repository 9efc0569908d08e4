import pandas as pd

from tasks.classification.clean import Params as CleanConfig
from tasks.shared.normalise import clean_text
from tests.helpers.stages import clean_rows


def test_normalisation_steps():
    p = CleanConfig()
    assert clean_text("ＡＢＣ１２３，好！", p) == "ABC123,好!"  # NFKC: full-width to half-width
    assert clean_text("\ufeff<p>房间<b>很</b>好</p>", p) == "房间 很 好"
    assert clean_text("详见 https://example.com/a?b=1 谢谢", p) == "详见 谢谢"
    assert clean_text("好\u200b\x07的\t\n  呀", p) == "好的 呀"


def test_traditional_to_simplified():
    assert (
        clean_text("這家酒店服務很好", CleanConfig(traditional_to_simplified=True))
        == "这家酒店服务很好"
    )


def test_every_dropped_row_is_quarantined_with_reason():
    df = pd.DataFrame(
        {
            "id": range(7),
            "text": ["房间很干净", "", "好", "房间很干净", "一般般吧", "一般般吧", "x" * 30],
            "label": ["1", "1", "1", "1", "0", "1", "0"],
        }
    )
    kept, quarantine, conflicts = clean_rows(df, CleanConfig(max_chars=20))
    assert kept["id"].tolist() == [0]
    reasons = dict(zip(quarantine["id"], quarantine["reason"]))
    assert reasons == {
        1: "empty",
        2: "too_short",
        3: "duplicate",
        4: "label_conflict",
        5: "label_conflict",
        6: "too_long",
    }
    assert len(kept) + len(quarantine) == len(df)  # nothing silently lost
    assert conflicts.to_dict("records") == [{"text": "一般般吧", "labels": "0,1", "ids": "4,5"}]
    assert quarantine.loc[quarantine["id"] == 1, "raw_text"].item() == ""


def _build(tmp_path, df, name, **params):
    from tasks.classification.clean import build
    from tasks.core import BuildContext

    raw = tmp_path / "download"
    raw.mkdir(exist_ok=True)
    df.to_parquet(raw / "data.parquet", index=False, row_group_size=7)
    out = tmp_path / name
    out.mkdir()
    result = build(
        BuildContext(inputs={"download": raw}, facts={}, out=out, params=CleanConfig(**params))
    )
    return (
        result,
        pd.read_parquet(out / "data.parquet"),
        pd.read_parquet(out / "quarantine.parquet"),
        pd.read_csv(out / "label_conflicts.csv", dtype=str),
    )


def test_partitioned_dedupe_matches_the_whole_corpus_in_memory(tmp_path, monkeypatch):
    import tasks.classification.clean as clean

    texts = [
        "房间很干净",
        "",
        "好",
        "一般般吧",
        "服务周到",
        "早餐丰富",
        "x" * 30,
        "位置方便",
        "隔音差",
    ]
    rows = [
        (
            i,
            f"{texts[i * 7 % len(texts)]}{'' if i % 4 else i % 3}",
            str((i // 9) % 2 if i % 5 else 0),
        )
        for i in range(120)
    ]
    df = pd.DataFrame(rows, columns=["id", "text", "label"]).astype(
        {"id": "int64", "text": "string", "label": "string"}
    )
    df["line"] = df["id"] + 2
    _, kept, quarantine, conflicts = _build(tmp_path, df, "whole", max_chars=20)  # one partition
    assert set(quarantine["reason"]) == {
        "empty",
        "too_short",
        "too_long",
        "duplicate",
        "label_conflict",
    }
    monkeypatch.setattr(clean, "CHUNK_ROWS", 10)
    monkeypatch.setattr(clean, "PARTITION_ROWS", 25)  # 5 hash partitions of (id, digest, label)
    assert clean.partition_count(len(df)) == 5
    result, data, bad, conflicts_csv = _build(tmp_path, df, "out", max_chars=20)
    pd.testing.assert_frame_equal(data, kept, check_dtype=False)
    pd.testing.assert_frame_equal(bad, quarantine, check_dtype=False)
    assert conflicts_csv.to_dict("records") == conflicts.to_dict("records")
    assert result.metrics["rows_kept"] + result.metrics["rows_dropped"] == len(df)
    assert result.metrics["dropped_duplicate"] == (quarantine["reason"] == "duplicate").sum()
