"""Offline protobuf + gRPC code generation with Debian's protoc and grpc_cpp_plugin.

`optstep_cc_proto_library` compiles the .proto files of one package into one cc_library whose
headers are included as "optstep/v1/<name>.pb.h" (the proto/ prefix is stripped).
"""

_PROTOC = "/usr/bin/protoc"
_GRPC_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def optstep_cc_proto_library(name, srcs, proto_root = "proto", deps = [], grpc_srcs = [], visibility = None):
    """Generates C++ messages for `srcs` and gRPC stubs for the subset `grpc_srcs`.

    Args:
      name: the cc_library's name.
      srcs: .proto files of this package.
      proto_root: the folder (from the workspace root) that import paths are relative to.
      deps: other optstep_cc_proto_library targets whose protos these import.
      grpc_srcs: the files of `srcs` that declare services.
      visibility: the cc_library's visibility.
    """
    pb_outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        pb_outs += [base + ".pb.h", base + ".pb.cc"]
    grpc_outs = []
    for src in grpc_srcs:
        base = src[:-len(".proto")]
        grpc_outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    native.filegroup(name = name + "_protos", srcs = srcs)

    pkg = native.package_name()
    rel = pkg[len(proto_root) + 1:] if pkg != proto_root else ""
    proto_paths = " ".join(["%s/%s" % (rel, s) if rel else s for s in srcs])

    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_protos" for d in deps],
        outs = pb_outs + grpc_outs,
        cmd = " && ".join([
            "OUT=$(GENDIR)/%s" % proto_root,
            "mkdir -p $$OUT",
            "%s --proto_path=%s --cpp_out=$$OUT %s" % (_PROTOC, proto_root, " ".join(["%s/%s" % (pkg, s) for s in srcs])),
        ] + ([
            "%s --proto_path=%s --grpc_out=$$OUT --plugin=protoc-gen-grpc=%s %s" % (
                _PROTOC,
                proto_root,
                _GRPC_CPP_PLUGIN,
                " ".join(["%s/%s" % (pkg, s) for s in grpc_srcs]),
            ),
        ] if grpc_srcs else [])),
        message = "protoc " + proto_paths,
    )

    native.cc_library(
        name = name,
        srcs = [o for o in pb_outs + grpc_outs if o.endswith(".cc")],
        hdrs = [o for o in pb_outs + grpc_outs if o.endswith(".h")],
        strip_include_prefix = "/" + proto_root,
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc_srcs else []),
        visibility = visibility,
    )
