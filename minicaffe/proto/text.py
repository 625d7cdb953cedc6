"""Reading and writing Caffe's schema files: prototxt (text format) and binary protos.

Parse errors name the file, line and column (1-based, like a compiler's) and, for the usual mistakes
(V1 ``layers`` syntax inside a new-style ``layer``, a misspelt field, a layer field outside its
``*_param`` block, an unquoted string), add a hint. Writes are atomic: a crash mid-write leaves the
old file, never a truncated one, which matters for snapshots written during long training runs.
"""

import difflib
import os
import re
import tempfile

from google.protobuf import message as _message
from google.protobuf import text_format

from . import caffe_pb2
from .upgrade import V1_LAYER_TYPES, upgrade_net, upgrade_solver


class PrototxtError(ValueError):
    """A text-format schema file that does not parse (or upgrade).

    The message starts with ``file:line:column: `` (line and column 1-based) when the position is
    known, else with ``file: ``. The parts are also kept as attributes.
    """

    def __init__(self, filename, line, column, message):
        self.filename = filename
        self.line = line
        self.column = column
        self.message = message
        where = filename if line is None else f"{filename}:{line}:{column}"
        super().__init__(f"{where}: {message}")


class BinaryProtoError(ValueError):
    """A binary schema file (.caffemodel, .binaryproto, .solverstate) that does not parse."""


# text_format.ParseError's str() is "LINE:COLUMN : message"; the position is also in GetLine().
_POSITION_PREFIX = re.compile(r"^\d+:\d+ : ")
_NO_FIELD = re.compile(r'Message type "caffe\.(\w+)" has no field named "(\w+)"')
_NO_ENUM_VALUE = re.compile(r'Enum type "caffe\.([\w.]+)" has no value named "?(\w+)"?')
_EXPECTED_STRING = re.compile(r"Expected string but found: '(\w+)'")

_V1_NAME_BY_TYPE = {v: k for k, v in V1_LAYER_TYPES.items() if v}
_V1_ONLY_FIELDS = ("blobs_lr", "weight_decay", "blob_share_mode")

# Fields that Caffe forks added to BVLC messages, and what BVLC Caffe says instead: a spelling
# guess ("did you mean type?" for SSD's eval_type) would send the reader the wrong way.
_SSD_SOLVER = ("comes from SSD's Caffe fork (detection evaluation in the solver); BVLC Caffe "
               "has no such field: remove it")
_FORK_FIELDS = {
    ("PoolingParameter", "ceil_mode"): (
        "ceil_mode comes from a Caffe fork (DeepLab, PSPNet, ...); BVLC Caffe writes "
        "round_mode: CEIL (its default) or round_mode: FLOOR (for ceil_mode: false)"),
    ("ConvolutionParameter", "hole"): (
        "hole is DeepLab v1's fork field for the atrous rate; BVLC Caffe calls it dilation"),
    ("ConvolutionParameter", "hole_h"): (
        "hole_h is DeepLab v1's fork field for the atrous rate; BVLC Caffe calls it dilation"),
    ("ConvolutionParameter", "hole_w"): (
        "hole_w is DeepLab v1's fork field for the atrous rate; BVLC Caffe calls it dilation"),
    ("DropoutParameter", "scale_train"): (
        "scale_train comes from the Caffe fork of py-faster-rcnn / R-FCN; BVLC Caffe always "
        "scales by 1/(1 - ratio) in training (scale_train: true); with scale_train: false that "
        "fork scales by (1 - ratio) at test time instead, which BVLC Caffe cannot express"),
    ("SolverParameter", "eval_type"): "eval_type " + _SSD_SOLVER,
    ("SolverParameter", "ap_version"): "ap_version " + _SSD_SOLVER,
    ("SolverParameter", "show_per_class_result"): "show_per_class_result " + _SSD_SOLVER,
}
_LAYER_FIELDS = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name
_SOLVER_FIELDS = caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_name


def _fields_holding(descriptor, field_name):
    """Names of ``descriptor``'s message fields whose message type has a field ``field_name``."""
    return [f.name for f in descriptor.fields
            if f.message_type is not None and field_name in f.message_type.fields_by_name]


def _hint(message, before):
    """A one-line suggestion for a text_format error message, or None.

    ``before`` is the source line up to the error column (the parser's message does not always
    quote it).
    """
    match = _NO_FIELD.search(message)
    if match:
        type_name, field = match.groups()
        if (type_name, field) in _FORK_FIELDS:
            return _FORK_FIELDS[(type_name, field)]
        descriptor = caffe_pb2.DESCRIPTOR.message_types_by_name.get(type_name)
        if type_name == "LayerParameter" and field in _V1_ONLY_FIELDS:
            return (f'"{field}" is a V1 field (legacy "layers {{ }}" blocks); in a "layer {{ }}" '
                    f'block give one "param {{ lr_mult: ... decay_mult: ... }}" per parameter blob')
        if type_name == "V1LayerParameter" and field in _LAYER_FIELDS:
            return (f'"{field}" exists only in new-style "layer {{ }}" blocks; this is a legacy '
                    f'"layers {{ }}" block')
        if type_name == "NetParameter" and field in _SOLVER_FIELDS:
            return "this looks like a solver definition; read it with read_solver_param"
        if type_name == "SolverParameter" and field in ("layer", "layers", "input"):
            return "this looks like a net definition; read it with read_net_param"
        if descriptor is not None:
            holders = _fields_holding(descriptor, field)
            if holders:
                return f'"{field}" belongs inside {" or ".join(h + " { }" for h in holders[:4])}'
            close = difflib.get_close_matches(field, list(descriptor.fields_by_name), n=3)
            if close:
                return "did you mean " + " or ".join(f'"{c}"' for c in close) + "?"
        return None

    match = _NO_ENUM_VALUE.search(message)
    if match:
        enum_name, value = match.groups()
        if enum_name == "V1LayerParameter.LayerType":
            legacy = _V1_NAME_BY_TYPE.get(value)
            if legacy:
                return (f'legacy "layers {{ }}" blocks take a type enum (type: {legacy}); for '
                        f'type: "{value}" write a new-style "layer {{ }}" block')
            if value.isupper():
                # an enum spelt as one, but none of BVLC's: a fork extended the V1 enum
                # (DeepLab v1's IMAGE_SEG_DATA, INTERP, SEG_ACCURACY), not a syntax slip
                return (f"{value} is no V1 layer type of BVLC Caffe: this net needs a Caffe "
                        "fork's layer (DeepLab v1's IMAGE_SEG_DATA or INTERP, for one), which "
                        "neither BVLC Caffe nor minicaffe has")
            return ('legacy "layers { }" blocks take a type enum such as CONVOLUTION; new-style '
                    '"layer { }" blocks take a quoted type string')
        enum = _find_enum(enum_name)
        if enum is not None:
            return "valid values: " + ", ".join(v.name for v in enum.values)
        return None

    match = _EXPECTED_STRING.search(message)
    if match:
        value = match.group(1)
        if value in V1_LAYER_TYPES and V1_LAYER_TYPES[value]:
            return (f'{value} is a legacy V1 type enum; a "layer {{ }}" block takes '
                    f'type: "{V1_LAYER_TYPES[value]}" (or write a legacy "layers {{ }}" block)')
        return f'strings must be quoted: "{value}"'

    if 'Expected ":"' in message and re.search(r"\bparam\s*$", before):
        return ('in a legacy "layers { }" block, param is a blob name string and the multipliers '
                'are blobs_lr / weight_decay; "param { lr_mult: ... }" needs a "layer { }" block')
    return None


def _find_enum(dotted_name):
    """The EnumDescriptor caffe.<dotted_name> (top level or nested in a message), or None."""
    parts = dotted_name.split(".")
    if len(parts) == 1:
        return caffe_pb2.DESCRIPTOR.enum_types_by_name.get(parts[0])
    descriptor = caffe_pb2.DESCRIPTOR.message_types_by_name.get(parts[0])
    for part in parts[1:-1]:
        if descriptor is None:
            return None
        descriptor = descriptor.nested_types_by_name.get(part)
    return None if descriptor is None else descriptor.enum_types_by_name.get(parts[-1])


# prototxt tokens: whitespace, a comment, a quoted string, punctuation, or a bare word
_TOKEN = re.compile(r"""\s+|\#[^\n]*
                        |"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'
                        |[{}<>:]|[^\s{}<>:"'\#]+""", re.VERBOSE)


def layer_blocks(text):
    """The top-level ``layer { }`` / ``layers { }`` blocks of a net prototxt, as dicts with
    ``line`` (1-based, of the block's keyword), ``end`` (line of its closing brace; None if
    unclosed), ``name`` and ``type`` (their values at the block's own level, or None).

    A tolerant scan (comments and quoted strings skipped, braces counted), so that errors about
    one layer can name its line: the protobuf parser keeps no positions."""
    blocks, depth, line = [], 0, 1
    current = None          # the layer block being scanned
    word, word_line = None, 0   # the last bare word, and its line
    key = None              # the field whose value comes next (after "name:" or "type:")
    for match in _TOKEN.finditer(text):
        tok = match.group()
        if tok[0].isspace() or tok[0] == "#":
            line += tok.count("\n")
        elif tok in ("{", "<"):
            if depth == 0 and word in ("layer", "layers"):
                current = {"line": word_line, "end": None, "name": None, "type": None}
                blocks.append(current)
            depth, word, key = depth + 1, None, None
        elif tok in ("}", ">"):
            depth, word, key = depth - 1, None, None
            if depth == 0 and current is not None:
                current["end"], current = line, None
        elif tok == ":":
            key = word if depth == 1 and word in ("name", "type") else None
        elif key is not None and current is not None:
            if current[key] is None:
                current[key] = tok[1:-1] if tok[0] in "\"'" else tok
            key = None
        else:
            word, word_line, key = tok, line, None
    return blocks


def layer_line(text, name, type_=None):
    """The line of the first top-level layer block named ``name`` (and, when given, of type
    ``type_``), or None."""
    for block in layer_blocks(text):
        if block["name"] == name and (type_ is None or block["type"] == type_):
            return block["line"]
    return None


def _fork_layer_hint(text, line, field):
    """For an unknown LayerParameter field inside a layer whose type BVLC Caffe does not have,
    a hint naming that type (the file comes from a Caffe fork), else None."""
    from ..layer import known_layer_types     # lazily: proto/ sits below the layers
    for block in layer_blocks(text):
        if block["line"] <= line and (block["end"] is None or line <= block["end"]):
            kind = block["type"]
            if kind is None or kind in known_layer_types():
                return None
            return (f'layer {block["name"]!r} (line {block["line"]}) has type "{kind}", which '
                    f'is no BVLC Caffe layer type, and "{field}" is no BVLC Caffe field: this '
                    "net needs a Caffe fork's custom layers (SSD, Faster R-CNN, ...), which "
                    "neither BVLC Caffe nor minicaffe has")
    return None


def _enclosing_layer(text, line):
    """' in layer NAME (line N) of type "T"' for the top-level layer block holding ``line``,
    or "" (outside any layer, or a block with neither name nor type). An unknown field deep in
    a 2,000-line net (a fork's ceil_mode in some pooling_param) then says which layer it is in;
    the parser's position is that of the field, not of its layer."""
    for block in layer_blocks(text):
        if block["line"] <= line and (block["end"] is None or line <= block["end"]):
            if block["name"] is None and block["type"] is None:
                return ""
            name = f' {block["name"]!r}' if block["name"] is not None else ""
            kind = f' of type "{block["type"]}"' if block["type"] is not None else ""
            return f' in layer{name} (line {block["line"]}){kind}'
    return ""


def _brace_hint(text, detail, line):
    """For a missing or extra brace, the usual slip in a hand-edited net, a hint naming the
    layer block that is not closed; else None. Protobuf's parser reports it where it notices,
    which is the next block ("LayerParameter has no field named layer") or the end of the
    file ('Expected "}"'), not where the brace is missing."""
    inside = '"layer" inside a layer block' if line is not None else ""
    if (re.search(r'(LayerParameter" has no field named "layers?"'
                  r'|V1LayerParameter" has no field named "layers?")', detail)
            or 'Expected "}"' in detail):
        blocks = [b for b in layer_blocks(text) if line is None or b["line"] <= line]
        # the scan counts braces: a block that swallowed the next one has no end before it
        open_ = [b for b in blocks if b["end"] is None or (line is not None and b["end"] > line)]
        unclosed = open_[-1] if open_ else None
        if unclosed is None:
            return None
        what = f'layer {unclosed["name"]!r}' if unclosed["name"] else "the layer"
        where = inside if detail.startswith("Message") else "the end of the file"
        return (f'{where}: the block of {what} that opens at line {unclosed["line"]} is '
                'missing its closing "}"')
    if "Expected identifier or number, got }" in detail:
        return 'a "}" with no block open: one "}" too many here, or a "{" missing before it'
    return None


def parse_text(text, message_cls, filename="<string>"):
    """Parse prototxt ``text`` into a new ``message_cls``; raise PrototxtError on bad input.

    Uses protobuf's strict parser, as Caffe does: unknown fields and a non-repeated field given
    twice are errors. ``text`` may be str or UTF-8 bytes.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    msg = message_cls()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        line, column = e.GetLine(), e.GetColumn()
        detail = _POSITION_PREFIX.sub("", str(e))
        lines = text.splitlines()
        source_line = lines[line - 1] if line is not None and 0 < line <= len(lines) else ""
        hint = _brace_hint(text, detail, line)
        match = _NO_FIELD.search(detail) or _NO_ENUM_VALUE.search(detail)
        if not hint and match and line is not None:
            if match.re is _NO_FIELD and match.group(1) == "LayerParameter":
                hint = _fork_layer_hint(text, line, match.group(2))
            # the fork hint names the layer; else the layer holding the unknown field or enum
            # value (a fork's V1 type such as IMAGE_SEG_DATA, a fork's pooling method) is named
            where = "" if hint else _enclosing_layer(text, line)
            if where:
                stop = "." if detail.endswith(".") else ""
                detail = detail[:len(detail) - len(stop)] + where + stop
        hint = hint or _hint(detail, source_line[:max((column or 1) - 1, 0)])
        if hint:
            detail = f"{detail} (hint: {hint})"
        raise PrototxtError(filename, line, column, detail) from None
    return msg


def _read_text(path):
    # Caffe reads bytes and never decodes them; prototxts from some forks carry GBK or Latin-1
    # comments. Replacing undecodable bytes keeps those files readable (they are almost always in
    # comments) instead of failing with a UnicodeDecodeError that names no line.
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def read_net_param(path, upgrade=True):
    """Read a net prototxt; with ``upgrade`` (Caffe's behaviour) convert legacy formats.

    Raises PrototxtError for syntax errors and for nets that cannot be upgraded.
    """
    net = parse_text(_read_text(path), caffe_pb2.NetParameter, filename=str(path))
    if upgrade:
        try:
            net = upgrade_net(net)
        except ValueError as e:
            raise PrototxtError(str(path), None, None, str(e)) from None
    return net


def read_solver_param(path, upgrade=True):
    """Read a solver prototxt; with ``upgrade`` turn ``solver_type`` into ``type`` as Caffe does.

    Nets given inline (net_param, train_net_param, ...) are returned as written, as in Caffe, which
    upgrades only nets it reads from files; pass them through upgrade_net to accept legacy ones.
    """
    solver = parse_text(_read_text(path), caffe_pb2.SolverParameter, filename=str(path))
    if upgrade:
        try:
            solver = upgrade_solver(solver)
        except ValueError as e:
            raise PrototxtError(str(path), None, None, str(e)) from None
    return solver


def _atomic_write(path, data):
    """Write ``data`` to ``path`` through a temporary file in the same directory + os.replace."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                   dir=directory)
    except OSError as e:    # say the file asked for, not the temporary name beside it
        why = ("does not exist" if isinstance(e, FileNotFoundError) else
               "is not writable" if isinstance(e, PermissionError) else e.strerror or str(e))
        raise type(e)(e.errno, f"cannot write {path}: the folder {directory} {why}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600; keep an existing file's mode, else use the usual 0644.
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(msg, path):
    """Write ``msg`` as prototxt to ``path`` atomically."""
    _atomic_write(path, text_format.MessageToString(msg).encode("utf-8"))


# Caffe's ReadProtoFromBinaryFile (src/caffe/util/io.cpp) sets the CodedInputStream's total
# bytes limit to INT_MAX (kProtoReadBytesLimit): a larger file fails to parse.
PROTO_READ_BYTES_LIMIT = 2**31 - 1


def read_binary(path, message_cls):
    """Read a binary proto file (.caffemodel, .binaryproto, .solverstate) into ``message_cls``.

    Raises BinaryProtoError naming the file and the expected message type when it does not parse.
    """
    size = os.path.getsize(path)
    if size > PROTO_READ_BYTES_LIMIT:
        raise BinaryProtoError(
            f"{path}: {size} bytes, more than the {PROTO_READ_BYTES_LIMIT} bytes (2 GB - 1) "
            f"that Caffe reads of a binary {message_cls.DESCRIPTOR.full_name}; Caffe cannot "
            "load this file either")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return message_cls.FromString(data)
    except _message.DecodeError as e:
        hint = ""
        head = data[:256].lstrip()
        if data.startswith(b"\x93NUMPY"):     # a mean.npy given as a mean_file, say
            hint = (" (it is a NumPy .npy file; write the array as a binary BlobProto: "
                    "open(name, 'wb').write(caffe.io.array_to_blobproto(np.load(path))"
                    ".SerializeToString()))")
        elif head[:1].isalpha() or head[:1] == b"#":
            hint = " (it looks like a text prototxt; read it with parse_text or read_net_param)"
        raise BinaryProtoError(f"{path}: not a valid binary {message_cls.DESCRIPTOR.full_name} "
                               f"({len(data)} bytes): {e}{hint}") from None


def write_binary(msg, path):
    """Write ``msg`` in the binary wire format to ``path`` atomically."""
    _atomic_write(path, msg.SerializeToString())
