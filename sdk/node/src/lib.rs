//! `idgen.node`: the Node face of `idgen-sdk`, one class per handle and a few functions.
//!
//! Every rule is the SDK's (and below it, the Rust crates'). This file converts JavaScript
//! values to the SDK's and back, and runs every call that can wait on the SDK's own threads
//! ([`Waiting`]), settling its promise on the event loop from there: never on libuv's pool,
//! whose four threads the host's `fs`, `dns` and `crypto` share, so a slow fleet stalls nothing
//! of theirs. What runs on the loop never waits: the
//! takes of an ID already at hand (the generator's, a plain Node-API function in `fast`; the
//! client's, from its buffer), decode, and `nextIdSync`, which says that it blocks (for the rest
//! of a millisecond at most). The package's `index.js` is the public face: it
//! refuses a JavaScript `number` as an ID, and turns this module's errors (a message of
//! [`MARK`] and JSON) into `IdgenRefusedError`, `IdgenRejectedError`, `IdgenInvalidInputError`
//! and `IdgenError`.

use std::collections::HashMap;
use std::sync::Arc;

use idgen_sdk::{Decoded, Error, IdInput, IdSource};
use napi::bindgen_prelude::{BigInt, Either, ToNapiValue, TypeName};
use napi::{Env, JsDeferred, Status};
use napi_derive::napi;

mod fast;

/// The start of the message of every error this module raises; the JSON after it says what the
/// error is (`kind`: `invalid`, `refused`, `rejected`, `failed`) and carries its fields.
const MARK: &str = "idgen:";

fn js_error(error: Error) -> napi::Error {
    napi::Error::new(Status::GenericFailure, error_message(error))
}

/// An error's message as index.js reads it: [`MARK`] and JSON.
fn error_message(error: Error) -> String {
    let body = match error {
        Error::Invalid { code, message } => serde_json::json!({ "kind": "invalid", "code": code, "message": message }),
        Error::Refused { reason, message, retry_after_ms } => serde_json::json!({
            "kind": "refused", "reason": reason, "message": message, "retryAfterMs": retry_after_ms,
        }),
        Error::Rejected { status, code, message } => {
            serde_json::json!({ "kind": "rejected", "status": status, "code": code, "message": message })
        }
        Error::Failed(message) => serde_json::json!({ "kind": "failed", "message": message }),
    };
    format!("{MARK}{body}")
}

/// `call`, with a panic in it (a bug) answered as the package's `failed` error: unwinding into
/// Node-API aborts the host process, whatever the caller's `try` would have done.
fn guarded<T>(call: impl FnOnce() -> napi::Result<T>) -> napi::Result<T> {
    let mut answer = None;
    match idgen_sdk::unwound(|| {
        answer = Some(call());
        Ok(())
    }) {
        Ok(()) => answer.expect("the call answered"),
        Err(panicked) => Err(js_error(panicked)),
    }
}

fn invalid(code: &'static str, message: String) -> napi::Error {
    js_error(Error::Invalid { code, message })
}

/// A call that may wait, as a method returns it: becoming a JavaScript value makes a promise,
/// and the call runs on the SDK's own threads ([`idgen_sdk::runtime::spawn_waiting`]), which settle the
/// promise through a threadsafe function: its value is made on the event loop.
pub struct Waiting<T> {
    call: Box<dyn FnOnce() -> Result<T, Error> + Send>,
}

fn blocking<T>(call: impl FnOnce() -> Result<T, Error> + Send + 'static) -> Waiting<T> {
    Waiting { call: Box::new(call) }
}

type Settle<T> = Box<dyn FnOnce(Env) -> napi::Result<T>>;

/// A deferred promise, moved to the thread that settles it.
struct Deferred<T: ToNapiValue>(JsDeferred<T, Settle<T>>);

// SAFETY: a deferred is settled through a Node-API threadsafe function, whose purpose is to be
// called from any thread; the resolver runs on the event loop. The deferred's finalize slot,
// which holds no `Send` callback, is set by nothing here.
unsafe impl<T: ToNapiValue> Send for Deferred<T> {}

impl<T> TypeName for Waiting<T> {
    fn type_name() -> &'static str {
        "Promise"
    }

    fn value_type() -> napi::ValueType {
        napi::ValueType::Object
    }
}

impl<T: ToNapiValue + Send + 'static> ToNapiValue for Waiting<T> {
    unsafe fn to_napi_value(raw: napi::sys::napi_env, waiting: Self) -> napi::Result<napi::sys::napi_value> {
        let env = Env::from_raw(raw);
        let (deferred, promise) = env.create_deferred::<T, Settle<T>>()?;
        let deferred = Deferred(deferred);
        let call = waiting.call;
        idgen_sdk::runtime::spawn_waiting(move || {
            let deferred = deferred;
            match guarded(|| call().map_err(js_error)) {
                Ok(value) => deferred.0.resolve(Box::new(move |_| Ok(value))),
                Err(error) => deferred.0.reject(error),
            }
        })
        .map_err(js_error)?;
        // SAFETY: `raw` is the env this call was given.
        unsafe { ToNapiValue::to_napi_value(raw, promise) }
    }
}

/// An ID as JavaScript holds it (index.js has refused a `number`): its text, or a `bigint`.
enum Id {
    Text(String),
    Integer(i128),
}

impl Id {
    fn read(id: Either<String, BigInt>) -> Id {
        match id {
            Either::A(text) => Id::Text(text),
            Either::B(big) => Id::Integer(integer(&big)),
        }
    }

    fn input(&self) -> IdInput<'_> {
        match self {
            Id::Text(text) => IdInput::Text(text),
            Id::Integer(value) => IdInput::Integer(*value),
        }
    }
}

/// A `bigint` as an `i128`; one too large for it is `i128::MAX` (out of range either way, as
/// `IdInput::Integer` says).
fn integer(big: &BigInt) -> i128 {
    let magnitude = match big.words.as_slice() {
        [] => 0u128,
        [low] => u128::from(*low),
        [low, high] => u128::from(*low) | (u128::from(*high) << 64),
        _ => return i128::MAX,
    };
    match i128::try_from(magnitude) {
        Ok(value) if big.sign_bit => -value,
        Ok(value) => value,
        Err(_) => i128::MAX,
    }
}

/// A count of IDs (index.js has checked it is an integer); the SDK checks its range.
fn count(count: i64) -> u64 {
    u64::try_from(count).unwrap_or(0)
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*bytes).hyphenated().to_string()
}

/// `Decoded` as index.js receives it (it makes `createdAt` a `Date`).
#[napi(object)]
pub struct DecodedFields {
    pub id: String,
    pub layout: String,
    pub created_at_unix_ms: i64,
    pub region_number: Option<u32>,
    pub region: Option<String>,
    pub machine: Option<u32>,
    pub sequence: Option<u32>,
}

impl From<Decoded> for DecodedFields {
    fn from(d: Decoded) -> Self {
        DecodedFields {
            id: d.id,
            layout: d.layout,
            created_at_unix_ms: d.created_at_unix_ms,
            region_number: d.region_number,
            region: d.region,
            machine: d.machine,
            sequence: d.sequence,
        }
    }
}

/// A batch as one string, its IDs joined by commas (index.js splits it): one JavaScript string
/// made instead of one per ID, which cost about 200 ns each through napi-rs's array.
fn joined<T>(items: &[T], mut write: impl FnMut(&mut String, &T)) -> String {
    let mut text = String::with_capacity(items.len() * 37);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        write(&mut text, item);
    }
    text
}

/// The calls both ID handles answer ([`IdSource`]: the embedded generator and the fleet client),
/// written once: `source()` of either handle gives one, and index.js's `IdSource` wraps it.
#[napi]
pub struct NativeIdSource {
    inner: Arc<dyn IdSource>,
}

#[napi]
impl NativeIdSource {
    #[napi]
    pub fn next_id(&self) -> Waiting<String> {
        let source = self.inner.clone();
        blocking(move || source.next_id().map(|id| id.to_string()))
    }

    #[napi]
    pub fn next_id_bigint(&self) -> Waiting<BigInt> {
        let source = self.inner.clone();
        blocking(move || source.next_id().map(BigInt::from))
    }

    #[napi]
    pub fn next_ids(&self, n: i64) -> Waiting<String> {
        let source = self.inner.clone();
        blocking(move || {
            let ids = source.next_ids(count(n))?;
            Ok(joined(&ids, |text, id| text.push_str(itoa::Buffer::new().format(*id))))
        })
    }

    #[napi]
    pub fn next_uuids(&self, n: i64) -> Waiting<String> {
        let source = self.inner.clone();
        blocking(move || {
            let uuids = source.next_uuids(count(n))?;
            Ok(joined(&uuids, |text, bytes| {
                text.push_str(
                    uuid::Uuid::from_bytes(*bytes).hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()),
                )
            }))
        })
    }

    #[napi]
    pub fn decode(&self, id: Either<String, BigInt>) -> napi::Result<DecodedFields> {
        let id = Id::read(id);
        guarded(|| self.inner.decode(id.input()).map(DecodedFields::from).map_err(js_error))
    }
}

/// The embedded generator (index.js's `EmbeddedGenerator` wraps it).
#[napi]
pub struct NativeEmbedded {
    inner: Arc<idgen_sdk::Embedded>,
}

#[napi(object)]
pub struct Identity {
    pub region: String,
    pub region_number: u32,
    pub holder: String,
}

#[napi]
impl NativeEmbedded {
    /// Starts a generator; `ready_timeout_ms` absent: settle at once, refusing until the first
    /// claim.
    #[napi]
    pub fn start(
        config_path: Option<String>,
        env_prefix: Option<String>,
        ready_timeout_ms: Option<u32>,
    ) -> Waiting<NativeEmbedded> {
        blocking(move || {
            let timeout = ready_timeout_ms.map(|ms| std::time::Duration::from_millis(ms.into()));
            let inner = idgen_sdk::Embedded::start(
                config_path.as_deref().map(std::path::Path::new),
                env_prefix.as_deref(),
                timeout,
            )?;
            Ok(NativeEmbedded { inner: Arc::new(inner) })
        })
    }

    /// `tryNextId` bound to this generator, as a plain Node-API function (see `fast`): the
    /// hot path of `nextIdSync()` and `nextId()`.
    #[napi]
    pub fn bind_try_next_id(&self, env: Env) -> napi::Result<fast::BoundFunction> {
        guarded(|| fast::bind_try_next_id(env.raw(), self.inner.clone()))
    }

    /// The calls it shares with the fleet client.
    #[napi]
    pub fn source(&self) -> NativeIdSource {
        NativeIdSource { inner: self.inner.clone() }
    }

    /// One ID on this thread: when the current millisecond has none left, it waits for the
    /// next (under a millisecond); a refusal throws at once.
    #[napi]
    pub fn next_id_sync(&self) -> napi::Result<String> {
        guarded(|| self.inner.next_id().map(|id| id.to_string()).map_err(js_error))
    }

    /// Nothing while issuing; else throws the refusal a call would get now.
    #[napi]
    pub fn health(&self) -> napi::Result<()> {
        guarded(|| self.inner.health().map_err(js_error))
    }

    #[napi]
    pub fn identity(&self) -> napi::Result<Identity> {
        guarded(|| {
            let (region, region_number, holder) = self.inner.identity().map_err(js_error)?;
            Ok(Identity { region, region_number, holder })
        })
    }

    #[napi]
    pub fn metrics_text(&self) -> napi::Result<String> {
        guarded(|| self.inner.metrics_text().map_err(js_error))
    }

    #[napi]
    pub fn close(&self) -> Waiting<()> {
        let inner = self.inner.clone();
        blocking(move || inner.close())
    }
}

/// The fleet client (index.js's `Client` wraps it).
#[napi]
pub struct NativeClient {
    inner: Arc<idgen_sdk::Client>,
}

#[napi]
impl NativeClient {
    /// A client from its settings as JSON, or from a TOML file (exactly one of the two).
    #[napi]
    pub fn connect(config_json: Option<String>, config_file: Option<String>) -> Waiting<NativeClient> {
        blocking(move || {
            let file = config_file.as_deref().map(std::path::Path::new);
            let inner = idgen_sdk::Client::from_settings(config_json.as_deref(), file)?;
            Ok(NativeClient { inner: Arc::new(inner) })
        })
    }

    /// One ID from the prefetched buffer if it holds a valid one, else `null` (never waits).
    #[napi]
    pub fn try_next_id(&self) -> napi::Result<Option<String>> {
        guarded(|| Ok(self.inner.try_next_id().map_err(js_error)?.map(|id| id.to_string())))
    }

    /// The calls it shares with the embedded generator.
    #[napi]
    pub fn source(&self) -> NativeIdSource {
        NativeIdSource { inner: self.inner.clone() }
    }

    #[napi]
    pub fn endpoint(&self) -> napi::Result<String> {
        guarded(|| self.inner.endpoint().map_err(js_error))
    }

    #[napi]
    pub fn metrics_text(&self) -> napi::Result<String> {
        guarded(|| self.inner.metrics_text().map_err(js_error))
    }

    #[napi]
    pub fn close(&self) -> napi::Result<()> {
        guarded(|| {
            self.inner.close();
            Ok(())
        })
    }
}

/// A mapping as the service answers it (`created` from a create only).
#[napi(object)]
pub struct MappingFields {
    pub public_id: String,
    pub internal_id: String,
    pub format: Option<String>,
    #[napi(js_name = "type")]
    pub kind: Option<String>,
    pub created: Option<bool>,
}

fn mapping(m: idgen_sdk::Mapping, created: Option<bool>) -> MappingFields {
    MappingFields {
        public_id: m.public_id,
        internal_id: m.internal_id.to_string(),
        format: m.format,
        kind: m.kind,
        created,
    }
}

/// The public-ID service's client (index.js's `PublicIds` wraps it).
#[napi]
pub struct NativePublicIds {
    inner: Arc<idgen_sdk::PublicIds>,
}

#[napi]
impl NativePublicIds {
    #[napi(constructor)]
    pub fn new(config_json: Option<String>, config_file: Option<String>) -> napi::Result<Self> {
        guarded(|| {
            let file = config_file.as_deref().map(std::path::Path::new);
            let inner = idgen_sdk::PublicIds::from_settings(config_json.as_deref(), file).map_err(js_error)?;
            Ok(NativePublicIds { inner: Arc::new(inner) })
        })
    }

    #[napi]
    pub fn create(
        &self,
        internal_id: Either<String, BigInt>,
        format: Option<String>,
        kind: Option<String>,
    ) -> Waiting<MappingFields> {
        let (inner, id) = (self.inner.clone(), Id::read(internal_id));
        blocking(move || {
            let (made, created) = inner.create(id.input(), format.as_deref(), kind.as_deref())?;
            Ok(mapping(made, Some(created)))
        })
    }

    #[napi]
    pub fn resolve(&self, public_id: String) -> Waiting<Option<MappingFields>> {
        let inner = self.inner.clone();
        blocking(move || Ok(inner.resolve(&public_id)?.map(|m| mapping(m, None))))
    }

    #[napi]
    pub fn lookup(
        &self,
        internal_id: Either<String, BigInt>,
        format: Option<String>,
        kind: Option<String>,
    ) -> Waiting<Option<MappingFields>> {
        let (inner, id) = (self.inner.clone(), Id::read(internal_id));
        blocking(move || Ok(inner.lookup(id.input(), format.as_deref(), kind.as_deref())?.map(|m| mapping(m, None))))
    }

    /// Lets go of its connections; every call after it is refused (closed).
    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}

/// `id` taken apart under the built-in schedule (a generator's or a client's `decode` uses the
/// registry's), regions named from `regions` (region number → name).
#[napi]
pub fn decode(id: Either<String, BigInt>, regions: Option<HashMap<String, String>>) -> napi::Result<DecodedFields> {
    let mut names = HashMap::new();
    for (number, name) in regions.unwrap_or_default() {
        let number = number
            .parse::<u32>()
            .map_err(|_| invalid("invalid_argument", format!("a region number is an integer, not {number:?}")))?;
        names.insert(number, name);
    }
    let id = Id::read(id);
    guarded(|| idgen_sdk::decode(id.input(), &names).map(DecodedFields::from).map_err(js_error))
}

#[napi(object)]
pub struct LayoutFrom {
    pub layout: String,
    pub region_bits: u32,
    pub machine_bits: u32,
    pub sequence_bits: u32,
    pub from_unix_ms: i64,
}

/// The built-in schedule, one entry per layout.
#[napi]
pub fn default_schedule() -> napi::Result<Vec<LayoutFrom>> {
    guarded(|| {
        Ok(idgen_sdk::default_schedule()
            .into_iter()
            .map(|e| LayoutFrom {
                layout: e.layout,
                region_bits: e.region_bits.into(),
                machine_bits: e.machine_bits.into(),
                sequence_bits: e.sequence_bits.into(),
                from_unix_ms: e.from_unix_ms,
            })
            .collect())
    })
}

#[napi(object)]
pub struct TypeId {
    /// Empty for none.
    pub prefix: String,
    pub uuid: String,
}

#[napi]
pub fn parse_typeid(text: String) -> napi::Result<TypeId> {
    guarded(|| match idgen_sdk::typeid::parse_typeid(&text) {
        Some((prefix, bytes)) => Ok(TypeId { prefix: prefix.to_owned(), uuid: uuid_text(&bytes) }),
        None => Err(invalid("invalid_typeid", format!("{text:?} is not a TypeID"))),
    })
}

#[napi]
pub fn typeid_text(prefix: String, uuid: String) -> napi::Result<String> {
    guarded(|| {
        let bytes = uuid::Uuid::try_parse(&uuid)
            .map_err(|e| invalid("malformed_uuid", format!("{uuid:?} is not a UUID: {e}")))?
            .into_bytes();
        idgen_sdk::typeid::typeid_text(&prefix, &bytes)
            .ok_or_else(|| invalid("invalid_typeid", format!("{prefix:?} is not a TypeID prefix")))
    })
}

#[napi(object)]
pub struct Constants {
    pub max_count: u32,
    pub default_env_prefix: String,
}

#[napi]
pub fn constants() -> Constants {
    Constants { max_count: idgen_sdk::MAX_COUNT as u32, default_env_prefix: idgen_sdk::DEFAULT_ENV_PREFIX.into() }
}
