fn main() {
    // The link arguments a Node-API module needs (its napi_* symbols are resolved at load time).
    napi_build::setup();
}
