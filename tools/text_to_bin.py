#!/usr/bin/env python3
"""text_to_bin — byte-level tokenizer: text files to llm.c .bin token shards.

Every byte of the input is one token id 0..255 (vocabulary 256), so any text
trains a model with model.vocab_size = 256 without a tokenizer library.

    tools/text_to_bin.py INPUT... --out-dir DIR [--val-fraction 0.1] [--name NAME]
        Concatenates the inputs (as bytes), writes the last val-fraction of the
        tokens to DIR/NAME_val.bin and the rest to DIR/NAME_train.bin.
    tools/text_to_bin.py --decode FILE.bin
        Writes the tokens of a shard back as bytes to stdout (for debugging).

Shard format (src/data/data.h, llm.c's): 256 little-endian int32 header
[magic 20240520, version 1, token count, 0...], then uint16 tokens.

Standard library only, so it runs with any python3. Errors are one line on
stderr and exit status 2, like shardlm's own input errors.
"""
import argparse
import array
import os
import struct
import sys

MAGIC_LLMC = 20240520
MAGIC_LLMC_LLAMA3 = 20240801
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# (magic, version) -> array typecode of a token
TOKEN_TYPES = {(MAGIC_LLMC, 1): "H", (MAGIC_LLMC, 2): "I", (MAGIC_LLMC_LLAMA3, 7): "I"}
EXIT_BAD_INPUT = 2


def fail(message):
    print("text_to_bin: error: " + message, file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def write_shard(path, tokens):
    """Writes bytes (each byte one token) as a uint16 version-1 shard, via a
    temporary file so a failed run never leaves a half-written shard."""
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC_LLMC, 1, len(tokens)
    # Byte tokens as little-endian uint16: the byte, then a zero high byte.
    body = bytearray(2 * len(tokens))
    body[0::2] = tokens
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<%di" % HEADER_INTS, *header))
            f.write(body)
        os.replace(tmp, path)
    except OSError as e:
        fail("cannot write '%s': %s; check the output directory and free disk space" % (path, e.strerror))


def read_shard(path):
    """Returns the token ids of a shard, checking its header and size."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail("cannot read '%s': %s" % (path, e.strerror))
    if len(data) < HEADER_BYTES:
        fail("'%s' has %d bytes, shorter than the %d-byte llm.c header" % (path, len(data), HEADER_BYTES))
    magic, version, count = struct.unpack_from("<3i", data)
    typecode = TOKEN_TYPES.get((magic, version))
    if typecode is None:
        fail("'%s' is not a supported llm.c token shard (magic %d version %d)" % (path, magic, version))
    tokens = array.array(typecode)
    width = tokens.itemsize
    if count < 0 or len(data) != HEADER_BYTES + count * width:
        fail("'%s': the header says %d tokens but the file has %d bytes of tokens (%d bytes each)"
             % (path, count, len(data) - HEADER_BYTES, width))
    tokens.frombytes(data[HEADER_BYTES:])
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens


def decode(path):
    tokens = read_shard(path)
    if tokens and max(tokens) > 255:
        i = next(i for i, t in enumerate(tokens) if t > 255)
        fail("'%s': token %d at position %d is not a byte; this shard was not made by the byte-level "
             "tokenizer" % (path, tokens[i], i))
    # tolist(): bytes(array) would copy the array's raw (2- or 4-byte) items
    sys.stdout.buffer.write(bytes(tokens.tolist()))
    sys.stdout.buffer.flush()


def encode(inputs, out_dir, val_fraction, name):
    if not 0.0 <= val_fraction < 1.0:
        fail("--val-fraction %g must be in [0, 1)" % val_fraction)
    parts = []
    for path in inputs:
        try:
            with open(path, "rb") as f:
                parts.append(f.read())
        except OSError as e:
            fail("cannot read input '%s': %s" % (path, e.strerror))
    text = b"".join(parts)
    if not text:
        fail("the input (%s) is empty; give at least one non-empty text file" % ", ".join(inputs))
    if len(text) > 2**31 - 1:
        fail("the input has %d bytes, more than one shard's int32 token count holds; split it" % len(text))

    n_val = int(len(text) * val_fraction)
    if val_fraction > 0 and n_val == 0:
        fail("--val-fraction %g of %d tokens is no token; give more text or a larger fraction"
             % (val_fraction, len(text)))
    n_train = len(text) - n_val
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        fail("cannot create output directory '%s': %s" % (out_dir, e.strerror))
    train_path = os.path.join(out_dir, name + "_train.bin")
    write_shard(train_path, text[:n_train])
    print("%s: %d tokens" % (train_path, n_train))
    if n_val:
        val_path = os.path.join(out_dir, name + "_val.bin")
        write_shard(val_path, text[n_train:])
        print("%s: %d tokens" % (val_path, n_val))
    print("vocabulary: 256 (byte-level); set model.vocab_size = 256")


def main():
    parser = argparse.ArgumentParser(
        description="Byte-level tokenizer: text files to llm.c .bin token shards (vocabulary 256).")
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="text files, concatenated in order")
    parser.add_argument("--out-dir", help="directory for NAME_train.bin and NAME_val.bin")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="fraction of the tokens, taken from the end, for NAME_val.bin (default 0.1)")
    parser.add_argument("--name", help="file name prefix (default: the first input's name without extension)")
    parser.add_argument("--decode", metavar="FILE.bin", help="print the tokens of a shard as text and exit")
    args = parser.parse_args()  # usage errors exit 2 too

    if args.decode:
        if args.inputs or args.out_dir:
            parser.error("--decode takes no inputs and no --out-dir")
        decode(args.decode)
        return
    if not args.inputs:
        parser.error("give at least one INPUT text file")
    if not args.out_dir:
        parser.error("--out-dir is required")
    name = args.name or os.path.splitext(os.path.basename(args.inputs[0]))[0] or "data"
    encode(args.inputs, args.out_dir, args.val_fraction, name)


if __name__ == "__main__":
    main()
