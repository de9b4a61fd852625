"""TFRecord files of tf.train.Example records, written without TensorFlow.

create_tfrecords' decoding processes write their own shards: importing TensorFlow in each would
cost seconds and hundreds of MB, and handing the pixels back to one writing process costs more
than decoding them. The formats are small and fixed:

- TFRecord (tensorflow/core/lib/io/record_writer.cc): per record, the length as uint64 little
  endian, its masked CRC32C, the data, the data's masked CRC32C (both uint32 little endian).
- tf.train.Example (tensorflow/core/example/example.proto, feature.proto), serialized as
  protobuf does with ``deterministic=True``: the feature map's entries in key order.

tests/test_data.py checks both byte for byte against TensorFlow's own.
"""

from __future__ import annotations

import struct

MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """record_writer.h's MaskedCrc: rotate right by 15 bits and add a constant."""
    # Imported here: only writing shards needs it. The trainer imports this package's manifest
    # reader on workers whose Python (a user's --image) may have TensorFlow but no google-crc32c.
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(features: dict[str, bytes | list[int]]) -> bytes:
    """A serialized tf.train.Example: bytes values become a BytesList of one, int lists an Int64List.

    Negative ints are not needed here and not supported (protobuf would write 10-byte varints)."""
    entries = []
    for key in sorted(features):
        value = features[key]
        if isinstance(value, bytes):
            feature = _field(1, _field(1, value))  # Feature.bytes_list = 1; BytesList.value = 1.
        else:
            if any(v < 0 for v in value):
                raise ValueError(f"feature {key!r}: negative ints are not supported")
            packed = b"".join(_varint(v) for v in value)
            feature = _field(3, _field(1, packed))  # Feature.int64_list = 3; Int64List.value = 1, packed.
        entries.append(_field(1, _field(1, key.encode()) + _field(2, feature)))  # Features.feature = 1.
    return _field(1, b"".join(entries))  # Example.features = 1.


class RecordWriter:
    """Appends records to one TFRecord file (uncompressed)."""

    def __init__(self, path):
        self._file = open(path, "wb")

    def write(self, record: bytes) -> None:
        length = struct.pack("<Q", len(record))
        self._file.write(length + struct.pack("<I", masked_crc(length)) + record
                         + struct.pack("<I", masked_crc(record)))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
