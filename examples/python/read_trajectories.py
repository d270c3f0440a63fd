"""Reads rxrl's trajectory topic from Kafka and prints each record: nothing in it but PyPI packages and the .proto.

The message classes are generated at startup from the repository's proto/rxrl/v1/records.proto (with grpcio-tools'
protoc, into ${XDG_CACHE_HOME:-~/.cache}/rxrl/proto-<hash>), so the reader always matches the schema beside it.

    pip install -r examples/python/requirements.txt
    python examples/python/read_trajectories.py --from-beginning --timeout 10
    python examples/python/read_trajectories.py --brokers kafka:9092 --topic myrun.trajectories --json --max 100
    python examples/python/read_trajectories.py --registry http://localhost:8081 --from-beginning --timeout 10

Values may be plain protobuf, or in the Confluent wire format when rxrl writes through a schema registry: with
--registry they are decoded by confluent-kafka's ProtobufDeserializer, which fetches the writer's schema by its id
(a registry that answers with the schema's text rather than its serialized form, as Apicurio's Confluent API does,
has the text compiled here); without --registry the framing is read and skipped here. Records of rxrl's earlier binary codec are skipped with a warning.

One line per record (partition@offset, key, sample index, reward, policy version, finish reason, response text, or
the error of a failed sample), or with --json one JSON object per record: the Kafka key, partition and offset, and
"record" holding every field of the TrajectoryRecord. Warnings and the final count go to stderr.
Exit status: 0 at the end (--max, --timeout, Ctrl-C or SIGTERM), 1 when the broker (or the registry) cannot be
reached, a package is missing or the .proto does not compile, 2 for bad arguments.
"""

import argparse
import atexit
import base64
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

PROTO_FILE = "rxrl/v1/records.proto"
RECORD_NAME = "TrajectoryRecord"
DEFAULT_PROTO_DIR = Path(__file__).resolve().parent.parent.parent / "proto"
# The first bytes of a record of rxrl's earlier binary codec ('rx').
LEGACY_MAGIC = b"rx"
# Longest single wait of the poll loop, so that a signal or --timeout is noticed promptly.
POLL_SLICE_S = 0.5
# How long to wait for the broker when --timeout is not given.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
PROG = "read_trajectories.py"


class Failure(Exception):
    """Ends the program with a one-line message and exit status 1."""


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit status 2
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got '{text}'")
    return value


def parse_args(argv: list) -> argparse.Namespace:
    parser = ArgumentParser(prog=PROG, description="Print rxrl's trajectory records from Kafka.")
    parser.add_argument(
        "--brokers",
        default=os.environ.get("KAFKA_BROKERS") or "localhost:9092",
        help="bootstrap servers, host:port[,host:port...] (default: $KAFKA_BROKERS or localhost:9092)",
    )
    parser.add_argument("--topic", default="rxrl.trajectories", help="topic (default: rxrl.trajectories)")
    parser.add_argument("--group", help="consumer group, whose offsets are committed (default: a fresh one, not kept)")
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the oldest record when the group has no committed offset (default: only new records)",
    )
    parser.add_argument("--max", type=positive_int, metavar="N", help="stop after printing N records")
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help=f"stop when no record arrives for that long; also how long to wait for the broker "
        f"(default: run until interrupted, waiting {DEFAULT_CONNECT_TIMEOUT_S:g} s for the broker)",
    )
    parser.add_argument(
        "--registry", metavar="URL", help="Confluent-compatible schema registry to resolve framed values' schema ids"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per record, every field")
    parser.add_argument(
        "--proto-dir",
        type=Path,
        default=DEFAULT_PROTO_DIR,
        help=f"directory holding {PROTO_FILE} (default: the repository's proto/)",
    )
    args = parser.parse_args(argv)
    if not (args.proto_dir / PROTO_FILE).is_file():
        parser.error(f"no {PROTO_FILE} under --proto-dir {args.proto_dir}")
    if args.registry is not None and not args.registry.startswith(("http://", "https://")):
        parser.error(f"--registry must be an http:// or https:// URL, got '{args.registry}'")
    if not args.brokers.strip():
        parser.error("--brokers is empty")
    return args


def warn(message: str) -> None:
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


# --- Message classes from the .proto ---------------------------------------------------------------------------


def load_records_module(proto_dir: Path):
    """Generates records_pb2.py from the .proto (once per .proto and grpcio-tools version) and imports it."""
    proto_bytes = (proto_dir / PROTO_FILE).read_bytes()
    tools_version = importlib.metadata.version("grpcio-tools")
    digest = hashlib.sha256(proto_bytes + b"\0grpcio-tools " + tools_version.encode()).hexdigest()[:16]
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rxrl"
    out_dir = cache_root / f"proto-{digest}"
    generated = out_dir / PROTO_FILE.replace(".proto", "_pb2.py")
    if not generated.is_file():
        try:
            cache_root.mkdir(parents=True, exist_ok=True)
            work_dir = Path(tempfile.mkdtemp(prefix=".proto-", dir=cache_root))
        except OSError:  # no writable cache: a temporary directory, removed at exit
            out_dir = Path(tempfile.mkdtemp(prefix="rxrl-proto-"))
            work_dir = out_dir
            atexit.register(shutil.rmtree, out_dir, True)
        try:
            generate(proto_dir, work_dir)
        except Failure:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        if work_dir != out_dir:
            try:
                work_dir.rename(out_dir)
            except OSError:  # another reader generated it meanwhile
                shutil.rmtree(work_dir, ignore_errors=True)
        generated = out_dir / PROTO_FILE.replace(".proto", "_pb2.py")
    spec = importlib.util.spec_from_file_location("rxrl_records_pb2", generated)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # e.g. code generated for a newer protobuf runtime than the one installed
        raise Failure(f"cannot load {generated}: {error}") from error
    return module


def generate(proto_dir: Path, out_dir: Path) -> None:
    from grpc_tools import protoc

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    argv = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out_dir}", PROTO_FILE]
    if protoc.main(argv) != 0:
        raise Failure(f"protoc could not compile {proto_dir / PROTO_FILE} (its errors are above)")


def compile_schema_text(text: str) -> bytes:
    """The serialized FileDescriptorProto of a .proto file's text (one without imports)."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="rxrl-schema-") as work_dir:
        source = Path(work_dir) / "schema.proto"
        source.write_text(text, encoding="utf-8")
        descriptor_set = Path(work_dir) / "schema.pb"
        if protoc.main(["protoc", f"-I{work_dir}", f"--descriptor_set_out={descriptor_set}", "schema.proto"]) != 0:
            raise ValueError("the registry's schema text does not compile (protoc's errors are above)")
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file
        return files[0].SerializeToString()


def message_index(records) -> int:
    """Position of TrajectoryRecord among the file's top-level messages (the Confluent framing's message index)."""
    from google.protobuf import descriptor_pb2

    file_proto = descriptor_pb2.FileDescriptorProto()
    records.DESCRIPTOR.CopyToProto(file_proto)
    return [message.name for message in file_proto.message_type].index(RECORD_NAME)


# --- Decoding ----------------------------------------------------------------------------------------------------


class Skip(Exception):
    """A value that is not printed; the message says why."""


def read_varint(data: bytes, pos: int) -> tuple:
    """A zigzag varint at data[pos:], as Confluent's message-index array writes it: (value, next position)."""
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise Skip("truncated Confluent message-index array")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos


def unframe(value: bytes) -> tuple:
    """Splits a Confluent-framed value: (schema id, message indexes, protobuf bytes)."""
    if len(value) < 6:
        raise Skip("truncated Confluent header")
    schema_id = int.from_bytes(value[1:5], "big")
    count, pos = read_varint(value, 5)
    if count == 0:  # the shortcut for [0]
        return schema_id, [0], value[pos:]
    if count < 0 or count > 100:
        raise Skip(f"bad Confluent message-index count {count}")
    indexes = []
    for _ in range(count):
        index, pos = read_varint(value, pos)
        indexes.append(index)
    return schema_id, indexes, value[pos:]


class Decoder:
    """Turns a Kafka value into a TrajectoryRecord, or raises Skip."""

    def __init__(self, records, topic: str, registry_url: str | None = None):
        from google.protobuf.message import DecodeError

        self.record_class = records.TrajectoryRecord
        self.index = message_index(records)
        self.topic = topic
        self.decode_error = DecodeError
        self.registry = None
        self.deserializer = None
        if registry_url is not None:
            from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

            self.registry = registry_client_class()(
                {
                    "url": registry_url,
                    "timeout": 10,
                    "max.retries": 2,
                    "retries.wait.ms": 500,
                    "retries.max.wait.ms": 2000,
                }
            )
            # The subject is `<topic>-value`, as rxrl registers it (the default strategy would first ask the registry
            # for topic associations, which other Confluent-compatible registries lack). The message-index framing is
            # read whatever the configuration; 'use.deprecated.format' must stay False (True is refused).
            self.deserializer = ProtobufDeserializer(
                self.record_class,
                {"use.deprecated.format": False, "subject.name.strategy.type": "TOPIC"},
                schema_registry_client=self.registry,
            )

    def decode(self, value: bytes, headers) -> object:
        if value is None:
            raise Skip("no value (a tombstone)")
        if value.startswith(LEGACY_MAGIC):
            raise Skip("a record of rxrl's earlier binary codec ('rx'), which this reader does not decode")
        if self.deserializer is not None and (value[:1] == b"\0" or has_schema_id_header(headers)):
            return self.deserialize(value, headers)
        if value[:1] == b"\0":  # Confluent framing, read here without a registry
            schema_id, indexes, value = unframe(value)
            if indexes != [self.index]:
                raise Skip(
                    f"Confluent message index {indexes} (schema id {schema_id}) is not {RECORD_NAME}'s [{self.index}]"
                )
        record = self.record_class()
        try:
            record.ParseFromString(value)
        except self.decode_error as error:
            raise Skip(f"not a {RECORD_NAME}: {error}") from None
        return record

    def deserialize(self, value: bytes, headers):
        from confluent_kafka.schema_registry.common._httpx_compat import httpx
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

        try:
            record = self.deserializer(value, SerializationContext(self.topic, MessageField.VALUE, headers))
            if value[:1] == b"\0":
                # The deserializer parses whatever the framing names as a TrajectoryRecord: check the name it has in
                # the writer's schema (which the deserializer just fetched, so this is served from the client's cache).
                schema_id, indexes, _ = unframe(value)
                name = self.writer_message_name(schema_id, indexes)
                if name != self.record_class.DESCRIPTOR.full_name:
                    raise Skip(f"a {name} (schema id {schema_id}), not a {RECORD_NAME}")
            return record
        except httpx.TransportError as error:
            raise Failure(f"cannot reach the schema registry: {error}") from error
        except (SchemaRegistryError, SerializationError, self.decode_error, EOFError, ValueError) as error:
            # ValueError: also a registry's schema text that does not compile
            raise Skip(f"the schema registry deserializer refused it: {error}") from None

    def writer_message_name(self, schema_id: int, indexes: list) -> str:
        """Full name of the message that the framing's indexes point at in the registered schema `schema_id`."""
        from google.protobuf import descriptor_pb2

        schema = self.registry.get_schema(schema_id, f"{self.topic}-value", "serialized")
        file_proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema.schema_str))
        names = [file_proto.package] if file_proto.package else []
        messages = file_proto.message_type
        for index in indexes:
            if not 0 <= index < len(messages):
                raise Skip(f"message index {indexes} is not in schema id {schema_id}")
            names.append(messages[index].name)
            messages = messages[index].nested_type
        return ".".join(names)


def registry_client_class():
    """confluent-kafka's SchemaRegistryClient, also for registries that answer `format=serialized` with the schema's
    text (Apicurio's Confluent API does): that text is compiled here into the serialized descriptor that
    ProtobufDeserializer expects."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    class Client(SchemaRegistryClient):
        def __init__(self, conf: dict):
            super().__init__(conf)
            self.compiled = {}  # schema text -> base64 of its FileDescriptorProto

        def get_schema(self, schema_id, subject_name=None, fmt=None, reference_format=None):
            schema = super().get_schema(schema_id, subject_name, fmt, reference_format)
            if fmt != "serialized" or schema.schema_type != "PROTOBUF" or is_base64(schema.schema_str):
                return schema
            if schema.schema_str not in self.compiled:
                serialized = compile_schema_text(schema.schema_str)
                self.compiled[schema.schema_str] = base64.standard_b64encode(serialized).decode("ascii")
            serialized = self.compiled[schema.schema_str]
            return Schema(serialized, schema.schema_type, schema.references, schema.metadata, schema.rule_set)

    return Client


def is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
        return True
    except ValueError:
        return False


def has_schema_id_header(headers) -> bool:
    return any(name == "__value_schema_id" for name, _ in headers or ())


# --- Printing ----------------------------------------------------------------------------------------------------


def key_text(key: bytes):
    return None if key is None else key.decode("utf-8", errors="backslashreplace")


def json_line(message, record) -> str:
    from google.protobuf.json_format import MessageToDict

    fields = MessageToDict(record, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return json.dumps(
        {
            "key": key_text(message.key()),
            "partition": message.partition(),
            "offset": message.offset(),
            "record": in_declaration_order(fields, record.DESCRIPTOR),
        }
    )


def in_declaration_order(fields: dict, descriptor) -> dict:
    """MessageToDict's output with the keys in the .proto's order (it puts the fields left at their default last)."""
    ordered = {}
    for field in descriptor.fields:
        if field.name not in fields:
            continue
        value = fields[field.name]
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if isinstance(value, dict):
                value = in_declaration_order(value, field.message_type)
            elif isinstance(value, list):
                value = [in_declaration_order(v, field.message_type) if isinstance(v, dict) else v for v in value]
        ordered[field.name] = value
    return ordered


def human_line(message, record, finish_reason_name) -> str:
    where = f"p{message.partition()}@{message.offset()} {key_text(message.key())}"
    kind = record.WhichOneof("output")
    if kind == "trajectory":
        t = record.trajectory
        text = json.dumps(t.response_text, ensure_ascii=False) if t.HasField("response_text") else "(no text)"
        finish = finish_reason_name(t.finish_reason).removeprefix("FINISH_REASON_").lower()
        return f"{where} #{t.run_id} reward={t.reward:g} version={t.policy_version} {finish} {text}"
    if kind == "failure":
        f = record.failure
        if f.skipped:
            return f"{where} #{f.run_id} skipped"
        retriable = " (retriable)" if f.retriable else ""
        error = f"{f.error_name}: {f.error_message}".replace("\n", " ")
        return f"{where} #{f.run_id} failed {error}{retriable}"
    return f"{where} (neither a trajectory nor a failure: written by a newer rxrl?)"


# --- Consuming ---------------------------------------------------------------------------------------------------


class Reader:
    def __init__(self, args: argparse.Namespace, decoder: Decoder, records):
        from confluent_kafka import Consumer

        self.args = args
        self.decoder = decoder
        self.finish_reason_name = records.FinishReason.Name
        self.stopping = False
        self.connected = False
        self.last_error = None
        self.printed = 0
        self.skipped = 0
        self.idle_since = time.monotonic()
        self.consumer = Consumer(
            {
                "bootstrap.servers": args.brokers,
                "group.id": args.group or f"rxrl-read-trajectories-{uuid.uuid4().hex[:12]}",
                "auto.offset.reset": "earliest" if args.from_beginning else "latest",
                "enable.auto.commit": args.group is not None,
                "client.id": "rxrl-read-trajectories",
                "error_cb": self.on_error,
                "log_level": 0,  # librdkafka's own log is silent: errors come through error_cb
            }
        )

    def on_error(self, error) -> None:
        text = error.str()
        if self.connected and text != self.last_error:
            warn(f"kafka: {text}")
        self.last_error = text

    def on_assign(self, consumer, partitions) -> None:
        self.idle_since = time.monotonic()

    def connect(self) -> None:
        """Waits (bounded) until the broker answers a metadata request."""
        from confluent_kafka import KafkaException

        limit = self.args.timeout or DEFAULT_CONNECT_TIMEOUT_S
        deadline = time.monotonic() + limit
        while not self.stopping:
            try:
                metadata = self.consumer.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                break
            except KafkaException as error:
                self.consumer.poll(0)  # serves error_cb, which says why
                if time.monotonic() >= deadline:
                    reason = self.last_error or error.args[0].str()
                    raise Failure(f"cannot reach the Kafka broker(s) {self.args.brokers} within {limit:g} s: {reason}")
        else:
            return
        self.connected = True
        if self.args.topic not in metadata.topics:
            warn(f"topic {self.args.topic} does not exist (yet); waiting for it")

    def run(self) -> None:
        from confluent_kafka import KafkaError

        self.connect()
        if self.stopping:
            return
        self.consumer.subscribe([self.args.topic], on_assign=self.on_assign)
        self.idle_since = time.monotonic()
        while not self.stopping:
            if self.args.max is not None and self.printed >= self.args.max:
                return
            wait = POLL_SLICE_S
            if self.args.timeout is not None:
                left = self.idle_since + self.args.timeout - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            message = self.consumer.poll(wait)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise Failure(f"kafka: {error.str()}")
                if error.code() not in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    warn(f"kafka: {error.str()}")
                continue
            self.idle_since = time.monotonic()
            self.handle(message)

    def handle(self, message) -> None:
        try:
            record = self.decoder.decode(message.value(), message.headers())
        except Skip as reason:
            self.skipped += 1
            warn(f"skipping {message.topic()}/{message.partition()}@{message.offset()}: {reason}")
            return
        if self.args.json:
            line = json_line(message, record)
        else:
            line = human_line(message, record, self.finish_reason_name)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        self.printed += 1

    def close(self) -> None:
        self.consumer.close()


def check_packages() -> None:
    for module in ("confluent_kafka", "google.protobuf", "grpc_tools"):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            raise Failure(f"Python package {module} is missing: pip install -r examples/python/requirements.txt")


def main(argv: list) -> int:
    args = parse_args(argv)
    reader = None

    def stop(signum, frame) -> None:
        if reader is not None:
            reader.stopping = True
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        check_packages()
        records = load_records_module(args.proto_dir)
        decoder = Decoder(records, args.topic, args.registry)
        reader = Reader(args, decoder, records)
        try:
            reader.run()
        finally:
            reader.close()
    except Failure as failure:
        warn(str(failure))
        return 1
    except KeyboardInterrupt:  # a signal before the consumer existed
        return 0
    except BrokenPipeError:  # stdout closed early (e.g. piped into head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    skipped = f", skipped {reader.skipped}" if reader.skipped else ""
    warn(f"printed {reader.printed} record(s){skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
