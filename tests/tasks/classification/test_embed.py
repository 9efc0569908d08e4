import numpy as np
from gensim.models import KeyedVectors

from tasks.classification.embed import FastTextParams as FastTextEmbedConfig
from tasks.classification.embed import Params as EmbedConfig
from tasks.classification.embed import fasttext_keyed_vectors, train_fasttext
from tasks.util.vectors import Word2VecParams as Word2VecConfig
from tasks.util.vectors import load_word2vec, neighbours, train_word2vec

LINES = [
    "酒店 房间 很 干净",
    "酒店 服务 很 好",
    "房间 服务 都 很 干净",
    "早餐 太 差",
    "酒店 早餐 不错",
] * 40


def corpus(tmp_path):
    path = tmp_path / "train.words.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def test_word2vec_variants_save_and_reload(tmp_path):
    path = corpus(tmp_path)
    for sg, hs in ((False, False), (True, True)):
        params = EmbedConfig(
            word2vec=Word2VecConfig(vector_size=16, min_count=1, epochs=3, sg=sg, hs=hs), workers=1
        )
        kv = train_word2vec(path, params)
        assert "酒店" in kv and kv.vector_size == 16
    kv.save_word2vec_format(str(tmp_path / "word2vec.bin"), binary=True)
    kv.save_word2vec_format(str(tmp_path / "w.txt"))
    assert load_word2vec(tmp_path).most_similar("酒店", topn=2) == kv.most_similar("酒店", topn=2)
    assert (
        KeyedVectors.load_word2vec_format(str(tmp_path / "w.txt")).index_to_key == kv.index_to_key
    )
    rows = neighbours(
        "word2vec",
        ["酒店", "没见过"],
        lambda w, n: kv.most_similar(w, topn=n) if w in kv else [],
        3,
    )
    assert [r["rank"] for r in rows] == [1, 2, 3] and all(r["word"] == "酒店" for r in rows)


def test_fasttext_subwords_cover_unseen_words(tmp_path):
    params = EmbedConfig(fasttext=FastTextEmbedConfig(dim=30, epoch=2, bucket=50000), workers=1)
    model = train_fasttext(corpus(tmp_path), params)
    kv = fasttext_keyed_vectors(model)
    assert "酒店" in kv and kv.vector_size == 30
    assert abs(model.get_word_vector("酒店房").sum()) > 0  # unseen word, vector from its subwords


def test_fasttext_input_matrix_is_fully_initialised(tmp_path):
    """fastText 0.9.3 leaves blocks of its input matrix uninitialised with < 10 threads; without
    subwords every run then stopped with "Encountered NaN." here (0 of 6 runs passed before the
    fix)."""
    params = EmbedConfig(
        fasttext=FastTextEmbedConfig(dim=30, epoch=1, minn=0, maxn=0, bucket=50000), workers=2
    )
    for _ in range(3):
        model = train_fasttext(corpus(tmp_path), params)
        assert np.isfinite(model.get_input_matrix()).all()


def test_fasttext_dim_must_be_a_multiple_of_ten():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="multiple of 10"):
        FastTextEmbedConfig(dim=32)


def test_networks_start_from_either_embedding(tmp_path):
    """train.embeddings: Word2Vec covers the words it saw; fastText's subwords give every token a
    vector."""
    import pytest

    from tasks.classification.models.networks import pretrained_matrix
    from tasks.errors import DataError
    from tasks.util.vectors import keyed_word_vectors, load_word_vectors

    path = corpus(tmp_path)
    params = EmbedConfig(
        word2vec=Word2VecConfig(vector_size=10, min_count=1, epochs=1),
        fasttext=FastTextEmbedConfig(dim=10, epoch=1, bucket=1000),
        workers=1,
    )
    train_word2vec(path, params).save_word2vec_format(str(tmp_path / "word2vec.bin"), binary=True)
    itos = ["[PAD]", "[UNK]", "酒店", "房间", "没见过的词"]
    w2v = load_word_vectors(tmp_path, "word2vec")
    matrix, coverage = pretrained_matrix(itos, w2v, seed=0)
    assert (
        coverage == 2 / 5
        and np.allclose(matrix[2].numpy(), w2v.get("酒店"))
        and matrix[0].abs().sum() == 0
    )
    with pytest.raises(DataError, match="no fastText model"):
        load_word_vectors(tmp_path, "fasttext")
    train_fasttext(path, params).save_model(str(tmp_path / "fasttext.bin"))
    ft = load_word_vectors(tmp_path, "fasttext")
    matrix, coverage = pretrained_matrix(itos, ft, seed=0)
    assert coverage == 3 / 5 and np.abs(matrix[4].numpy()).sum() > 0 and ft.name == "fasttext"
    assert keyed_word_vectors(load_word2vec(tmp_path)).get("没见过的词") is None


def test_projection_pictures_and_projector_export(tmp_path):
    """PCA and t-SNE pictures of word vectors with Chinese labels, and the TensorBoard projector
    files."""
    import numpy as np
    import pytest
    from gensim.models import KeyedVectors
    from PIL import Image

    from tasks.classification.embed import export_projector, plot_projection
    from tasks.util.plots import cjk_font

    if cjk_font() is None:
        pytest.skip("no CJK font installed (make install adds one)")
    words = [
        "酒店",
        "服务",
        "干净",
        "早餐",
        "差",
        "好",
        "房间",
        "前台",
        "位置",
        "价格",
        "设施",
        "环境",
    ]
    kv = KeyedVectors(vector_size=16)
    kv.add_vectors(words, np.random.default_rng(0).normal(size=(len(words), 16)).astype("float32"))
    for method in ("pca", "tsne"):
        path = plot_projection(kv, words, method, tmp_path / f"{method}.png", cjk_font(), seed=0)
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size[0] > 500
    folder = export_projector(kv, words, tmp_path / "projector")
    rows = (folder / "vectors.tsv").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 12 and len(rows[0].split("\t")) == 16
    assert (folder / "metadata.tsv").read_text(encoding="utf-8").split() == words


def test_analogy_and_similarity_probes_on_known_vectors():
    import numpy as np
    from gensim.models import KeyedVectors

    from tasks.classification.embed import analogy_rows, similarity_rows

    kv = KeyedVectors(vector_size=2)
    kv.add_vectors(
        ["男", "女", "国王", "王后", "苹果"],
        np.array([[1, 0], [1, 1], [3, 0], [3, 1.1], [-1, -3]], dtype=np.float32),
    )
    (row, missing) = analogy_rows(
        "w", kv, [["男", "女", "国王", "王后"], ["男", "女", "火星", "?"]], topn=2
    )
    assert (
        row["answers"].split()[0] == "王后" and row["expected_rank"] == 1 and row["missing"] == ""
    )
    assert (
        missing["answers"] == ""
        and missing["expected_rank"] is None
        and missing["missing"] == "火星 ?"
    )
    sims = similarity_rows("w", kv, [["国王", "王后"], ["国王", "火星"]])
    assert sims[0]["cosine"] > 0.9 and sims[1]["cosine"] is None


def test_pca_projection_matches_scikit_learn():
    """The PCA picture's coordinates are scikit-learn's PCA (full SVD) to float precision, signs
    included; a single word still gets two coordinates."""
    from sklearn.decomposition import PCA

    from tasks.classification.embed import pca_2d

    rng = np.random.default_rng(0)
    for rows, dim in [(150, 100), (20, 30), (3, 5)]:
        x = (rng.normal(size=(rows, dim)) * rng.uniform(0.1, 3, size=dim)).astype(np.float32)
        assert np.allclose(
            pca_2d(x), PCA(n_components=2, svd_solver="full").fit_transform(x), atol=1e-4
        )
    assert pca_2d(np.ones((1, 8), dtype=np.float32)).shape == (1, 2)
