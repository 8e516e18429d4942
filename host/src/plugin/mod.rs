//! Plugin runtime: loads WebAssembly component plugins with wasmtime, under limits.
