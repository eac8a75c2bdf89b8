//! colibri.v1 gRPC API (generated code lands here).
