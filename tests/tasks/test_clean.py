import pandas as pd

from tasks.clean import Params as CleanConfig
from tasks.clean import clean_frame, clean_text


def test_normalisation_steps():
    p = CleanConfig()
    assert clean_text("ＡＢＣ１２３，好！", p) == "ABC123,好!"  # NFKC: full-width to half-width
    assert clean_text("\ufeff<p>房间<b>很</b>好</p>", p) == "房间 很 好"
    assert clean_text("详见 https://example.com/a?b=1 谢谢", p) == "详见 谢谢"
    assert clean_text("好\u200b\x07的\t\n  呀", p) == "好的 呀"


def test_traditional_to_simplified():
    assert clean_text("這家酒店服務很好", CleanConfig(traditional_to_simplified=True)) == "这家酒店服务很好"


def test_every_dropped_row_is_quarantined_with_reason():
    df = pd.DataFrame({
        "id": range(7),
        "text": ["房间很干净", "", "好", "房间很干净", "一般般吧", "一般般吧", "x" * 30],
        "label": ["1", "1", "1", "1", "0", "1", "0"],
    })
    kept, quarantine, conflicts = clean_frame(df, CleanConfig(max_chars=20))
    assert kept["id"].tolist() == [0]
    reasons = dict(zip(quarantine["id"], quarantine["reason"]))
    assert reasons == {1: "empty", 2: "too_short", 3: "duplicate", 4: "label_conflict", 5: "label_conflict", 6: "too_long"}
    assert len(kept) + len(quarantine) == len(df)  # nothing silently lost
    assert conflicts.to_dict("records") == [{"text": "一般般吧", "labels": "0,1", "ids": "4,5"}]
    assert quarantine.loc[quarantine["id"] == 1, "raw_text"].item() == ""
