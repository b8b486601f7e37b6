"""write_dataset checks values on the way in (issue 21, item 2): token ids out of the dtype's range
(128000 as uint16 used to come back as 62464), negative ids for unsigned types, floats for an
integer type and samples of mixed dtypes raise ValueError naming the sample and the value, and
nothing is written; cast=True converts as NumPy does."""
import os

import pytest

from conftest import need

np = need("numpy")
import ferry  # noqa: E402


def written(path):
    return os.path.exists(path)


def test_out_of_range_names_sample_and_value(tmp_path):
    samples = [np.arange(10, dtype=np.int64), np.array([5, 128000, 7], dtype=np.int64)]
    with pytest.raises(ValueError, match=r"sample 1: value 128000 is out of uint16's range \[0, 65535\]"):
        ferry.write_dataset(tmp_path / "ds", samples, dtype=np.uint16)
    assert not written(tmp_path / "ds" / "ferry.idx")
    # the same from lists (NumPy makes them int64), and in the Megatron format
    with pytest.raises(ValueError, match="sample 2: value 70000"):
        ferry.write_dataset(tmp_path / "m", [[1, 2], [3], [70000]], dtype="uint16", format="megatron")
    assert not written(tmp_path / "m.idx")


def test_in_range_values_convert_exactly(tmp_path):
    samples = [list(range(i, i + 5)) for i in range(0, 65531, 997)] + [[65535, 0]]
    ferry.write_dataset(tmp_path / "ds", samples, dtype=np.uint16)
    ds = ferry.IndexedDataset(tmp_path / "ds")
    assert ds.dtype == np.uint16
    for i, s in enumerate(samples):
        assert ds[i].tolist() == s


def test_negative_ids_for_unsigned(tmp_path):
    with pytest.raises(ValueError, match=r"sample 0: negative id -1 is out of uint32's range"):
        ferry.write_dataset(tmp_path / "ds", [np.array([3, -1, 4], np.int32)], dtype="uint32")


def test_int32_range(tmp_path):
    with pytest.raises(ValueError, match=r"sample 1: value 2147483648 is out of int32's range"):
        ferry.write_dataset(tmp_path / "ds", [[1], [2 ** 31]], dtype=np.int32)
    with pytest.raises(ValueError, match=r"sample 0: value -2147483649"):
        ferry.write_dataset(tmp_path / "ds2", [[-(2 ** 31) - 1]], dtype=np.int32)


def test_floats_for_an_int_dtype(tmp_path):
    with pytest.raises(ValueError, match=r"sample 1: float value 1\.5 \(float64\) for the integer dtype uint16"):
        ferry.write_dataset(tmp_path / "ds", [[1, 2], [1.5, 2]], dtype=np.uint16)


def test_mixed_dtypes(tmp_path):
    samples = [np.arange(4, dtype=np.uint16), np.arange(4, dtype=np.uint16),
               np.array([9.0, 1.0], dtype=np.float32)]
    with pytest.raises(ValueError, match=r"sample 2: mixed dtypes: it is float32 \(first value 9\.0\), "
                                         r"sample 0 is uint16"):
        ferry.write_dataset(tmp_path / "ds", samples)  # dtype from the first sample
    with pytest.raises(ValueError, match="sample 1: mixed dtypes: it is int64"):
        ferry.write_dataset(tmp_path / "ds", [np.zeros(2, np.int32), np.zeros(2, np.int64)], dtype=np.int64)
    assert not written(tmp_path / "ds" / "ferry.idx")


def test_cast_opt_in_wraps_as_numpy_does(tmp_path):
    samples = [np.array([5, 128000], np.int64), np.array([1.7, 2.2], np.float64)]
    ferry.write_dataset(tmp_path / "ds", samples, dtype=np.uint16, cast=True)
    ds = ferry.IndexedDataset(tmp_path / "ds")
    assert ds[0].tolist() == [5, 62464] and ds[1].tolist() == [1, 2]


def test_float_datasets(tmp_path):
    ferry.write_dataset(tmp_path / "f", [np.array([1.5, -2.0]), [3, 4]], dtype=np.float32)
    assert ferry.IndexedDataset(tmp_path / "f")[1].tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match=r"sample 0: value 1e\+40 is out of float32's range"):
        ferry.write_dataset(tmp_path / "g", [np.array([1e40])], dtype=np.float32)


def test_bytes_and_same_dtype_unchanged(tmp_path):
    ferry.write_dataset(tmp_path / "b", ["abc", b"de"])
    assert bytes(ferry.IndexedDataset(tmp_path / "b")[1]) == b"de"
    a = [np.arange(300, dtype=np.uint16), np.arange(3, dtype=np.uint16), np.zeros(0, np.uint16)]
    ferry.write_dataset(tmp_path / "u", a)
    ds = ferry.IndexedDataset(tmp_path / "u")
    assert [x.tolist() for x in ds] == [x.tolist() for x in a]


def test_every_integer_pair_at_the_edges(tmp_path):
    # the C check (one pass, converting as it goes) against Python's arithmetic, for every pair
    # of integer dtypes at the values where ranges end
    from ferry import _ferry
    kinds = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
    edges = {0, 1, -1, 127, 128, 255, 256, -128, -129, 32767, 32768, 65535, 65536, -32768, -32769,
             2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, -2 ** 63,
             2 ** 63, 2 ** 64 - 1}
    for S in kinds:
        si = np.iinfo(S)
        for v in sorted(e for e in edges if si.min <= e <= si.max):
            x = np.array([0, v, 1] * 11, dtype=S)  # long enough for the vectorised loop
            for D in kinds:
                di = np.iinfo(D)
                out = np.empty(x.size, D)
                got = _ferry.narrow_into(x, out)
                if di.min <= v <= di.max:
                    assert got is None and out.tolist() == x.tolist(), (S, D, v, got)
                else:
                    assert got == (1, v), (S, D, v, got)
