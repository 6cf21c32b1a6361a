//! `idgen._native`: the Python face of `idgen-sdk`, one class per handle and a few functions.
//! Every rule is the SDK's (and below it, the Rust crates'); this file converts Python values
//! to the SDK's and the SDK's errors to Python's exceptions (`idgen._types`), and lets go of the
//! interpreter's lock while a call waits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use idgen_sdk::{Decoded, Error, IdInput, IdSource, MAX_COUNT};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyType};

static REFUSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_INPUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static IDGEN_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DECODED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static REJECTED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static MAPPING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static UUID: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The SDK's error as the Python exception `idgen` documents.
fn raise(py: Python<'_>, error: Error) -> PyErr {
    let made = match error {
        Error::Invalid { code, message } => {
            INVALID_INPUT.import(py, "idgen._types", "InvalidInputError").and_then(|class| class.call1((message, code)))
        }
        Error::Refused { reason, message, retry_after_ms } => REFUSED
            .import(py, "idgen._types", "RefusedError")
            .and_then(|class| class.call1((message, reason, retry_after_ms.map(|ms| ms as f64 / 1000.0)))),
        Error::Rejected { status, code, message } => {
            REJECTED.import(py, "idgen._types", "RejectedError").and_then(|class| class.call1((message, status, code)))
        }
        Error::Failed(message) => {
            IDGEN_ERROR.import(py, "idgen._types", "IdgenError").and_then(|class| class.call1((message,)))
        }
    };
    match made {
        Ok(exception) => PyErr::from_value(exception),
        Err(error) => error,
    }
}

fn invalid(code: &'static str, message: String) -> Error {
    Error::Invalid { code, message }
}

enum Id {
    Text(String),
    Integer(i128),
}

impl Id {
    fn input(&self) -> IdInput<'_> {
        match self {
            Id::Text(text) => IdInput::Text(text),
            Id::Integer(value) => IdInput::Integer(*value),
        }
    }
}

/// An ID as Python holds it: an `int` (any size) or its text (decimal, or a UUIDv7); a `bool`,
/// a `float` or anything else is a `TypeError`.
fn read_id(py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<Id> {
    if id.is_instance_of::<PyString>() {
        return Ok(Id::Text(id.extract()?));
    }
    if id.is_instance_of::<PyInt>() && !id.is_instance_of::<PyBool>() {
        return match id.extract::<i128>() {
            Ok(value) => Ok(Id::Integer(value)),
            Err(_) => Err(raise(
                py,
                invalid(
                    "out_of_range",
                    format!("{id} is out of range: an ID is a non-negative 63-bit integer (< 2^63)"),
                ),
            )),
        };
    }
    let kind = id.get_type().name()?;
    Err(PyTypeError::new_err(format!("an ID is an int or a str, not {kind}")))
}

/// A count of IDs: an `int` from 1 to `MAX_COUNT` (the SDK's bound).
fn read_count(py: Python<'_>, count: &Bound<'_, PyAny>) -> PyResult<u64> {
    if !count.is_instance_of::<PyInt>() || count.is_instance_of::<PyBool>() {
        let kind = count.get_type().name()?;
        return Err(PyTypeError::new_err(format!("count is an int, not {kind}")));
    }
    match count.extract::<u64>() {
        Ok(value) => Ok(value),
        Err(_) => Err(raise(py, invalid("invalid_count", format!("count must be 1 to {MAX_COUNT}, not {count}")))),
    }
}

fn read_timeout(py: Python<'_>, seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => {
            Err(raise(py, invalid("invalid_config", format!("ready_timeout is 0 to 86400 seconds or None, not {s}"))))
        }
    }
}

fn uuid<'py>(py: Python<'py>, bytes: &[u8; 16]) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("int", u128::from_be_bytes(*bytes))?;
    UUID.import(py, "uuid", "UUID")?.call((), Some(&kwargs))
}

fn uuids<'py>(py: Python<'py>, all: &[[u8; 16]]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for bytes in all {
        list.append(uuid(py, bytes)?)?;
    }
    Ok(list)
}

/// `idgen.Decoded`, the dataclass (`created_at` an aware `datetime`).
fn decoded<'py>(py: Python<'py>, d: Decoded) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    match (d.value, d.uuid) {
        (Some(value), _) => kwargs.set_item("id", value)?,
        (None, Some(bytes)) => kwargs.set_item("id", uuid(py, &bytes)?)?,
        (None, None) => kwargs.set_item("id", d.id)?,
    }
    kwargs.set_item("layout", d.layout)?;
    kwargs.set_item("created_at_unix_ms", d.created_at_unix_ms)?;
    kwargs.set_item("region_number", d.region_number)?;
    kwargs.set_item("region", d.region)?;
    kwargs.set_item("machine", d.machine)?;
    kwargs.set_item("sequence", d.sequence)?;
    DECODED.import(py, "idgen._types", "Decoded")?.call((), Some(&kwargs))
}

/// `next_ids` of either handle, the interpreter let go while it waits.
fn next_ids(py: Python<'_>, source: &impl IdSource, count: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let count = read_count(py, count)?;
    py.detach(|| source.next_ids(count)).map_err(|e| raise(py, e))
}

/// `next_uuids` of either handle, as `uuid.UUID`s.
fn next_uuids<'py>(py: Python<'py>, source: &impl IdSource, count: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let count = read_count(py, count)?;
    let all = py.detach(|| source.next_uuids(count)).map_err(|e| raise(py, e))?;
    uuids(py, &all)
}

/// `decode` of either handle, as `idgen.Decoded`.
fn decode_by<'py>(py: Python<'py>, source: &impl IdSource, id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let id = read_id(py, id)?;
    let answer = source.decode(id.input()).map_err(|e| raise(py, e))?;
    decoded(py, answer)
}

/// The embedded generator (`idgen.EmbeddedGenerator` subclasses it with the asyncio methods).
#[pyclass(subclass, frozen, module = "idgen._native", name = "EmbeddedGenerator")]
struct EmbeddedGenerator {
    inner: idgen_sdk::Embedded,
}

#[pymethods]
impl EmbeddedGenerator {
    #[new]
    #[pyo3(signature = (config_path = None, *, env_prefix = None, ready_timeout = Some(10.0)))]
    fn new(
        py: Python<'_>,
        config_path: Option<PathBuf>,
        env_prefix: Option<String>,
        ready_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let timeout = read_timeout(py, ready_timeout)?;
        let inner = py
            .detach(|| idgen_sdk::Embedded::start(config_path.as_deref(), env_prefix.as_deref(), timeout))
            .map_err(|e| raise(py, e))?;
        Ok(EmbeddedGenerator { inner })
    }

    fn next_id(&self, py: Python<'_>) -> PyResult<u64> {
        // The common case without letting go of the interpreter: no wait, no lock.
        match self.inner.try_next_id() {
            Ok(Some(id)) => Ok(id),
            Ok(None) => py.detach(|| self.inner.next_id()).map_err(|e| raise(py, e)),
            Err(error) => Err(raise(py, error)),
        }
    }

    /// One ID if the generator has one now (the common case), else `None`: never waits, never
    /// lets go of the interpreter. The asyncio methods try it before they wait elsewhere.
    fn try_next_id(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.inner.try_next_id().map_err(|e| raise(py, e))
    }

    fn next_ids(&self, py: Python<'_>, count: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        next_ids(py, &self.inner, count)
    }

    fn next_uuids<'py>(&self, py: Python<'py>, count: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        next_uuids(py, &self.inner, count)
    }

    fn decode<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        decode_by(py, &self.inner, id)
    }

    /// `None` while issuing, else the `Refused` a call would raise now (not raised).
    fn refusal(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner.health().err().map(|error| raise(py, error).into_value(py).into_any())
    }

    #[getter]
    fn region(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.identity().map(|(region, _, _)| region).map_err(|e| raise(py, e))
    }

    #[getter]
    fn region_number(&self, py: Python<'_>) -> PyResult<u32> {
        self.inner.identity().map(|(_, number, _)| number).map_err(|e| raise(py, e))
    }

    #[getter]
    fn holder(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.identity().map(|(_, _, holder)| holder).map_err(|e| raise(py, e))
    }

    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.metrics_text().map_err(|e| raise(py, e))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close()).map_err(|e| raise(py, e))
    }
}

/// The fleet client (`idgen.Client` subclasses it with keyword configuration and asyncio).
#[pyclass(subclass, frozen, module = "idgen._native", name = "Client")]
struct Client {
    inner: idgen_sdk::Client,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (config_json = None, config_file = None))]
    fn new(py: Python<'_>, config_json: Option<String>, config_file: Option<PathBuf>) -> PyResult<Self> {
        let inner = py
            .detach(|| idgen_sdk::Client::from_settings(config_json.as_deref(), config_file.as_deref()))
            .map_err(|e| raise(py, e))?;
        Ok(Client { inner })
    }

    fn next_id(&self, py: Python<'_>) -> PyResult<u64> {
        // A valid prefetched ID without letting go of the interpreter; else the wait, without it.
        match self.inner.try_next_id() {
            Ok(Some(id)) => Ok(id),
            Ok(None) => py.detach(|| self.inner.next_id()).map_err(|e| raise(py, e)),
            Err(error) => Err(raise(py, error)),
        }
    }

    /// One prefetched ID if the buffer holds a valid one, else `None`: never waits.
    fn try_next_id(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.inner.try_next_id().map_err(|e| raise(py, e))
    }

    fn next_ids(&self, py: Python<'_>, count: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        next_ids(py, &self.inner, count)
    }

    fn next_uuids<'py>(&self, py: Python<'py>, count: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        next_uuids(py, &self.inner, count)
    }

    fn decode<'py>(&self, py: Python<'py>, id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        decode_by(py, &self.inner, id)
    }

    #[getter]
    fn endpoint(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.endpoint().map_err(|e| raise(py, e))
    }

    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        self.inner.metrics_text().map_err(|e| raise(py, e))
    }

    fn close(&self) {
        self.inner.close();
    }
}

/// `idgen.Mapping`, the dataclass.
fn mapping<'py>(py: Python<'py>, m: idgen_sdk::Mapping, created: Option<bool>) -> PyResult<Bound<'py, PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("public_id", m.public_id)?;
    kwargs.set_item("internal_id", m.internal_id)?;
    kwargs.set_item("format", m.format)?;
    kwargs.set_item("type", m.kind)?;
    kwargs.set_item("created", created)?;
    MAPPING.import(py, "idgen._types", "PublicIdMapping")?.call((), Some(&kwargs))
}

/// The public-ID service's client (`idgen.PublicIds` subclasses it with keyword settings).
#[pyclass(subclass, frozen, module = "idgen._native", name = "PublicIds")]
struct PublicIds {
    inner: idgen_sdk::PublicIds,
}

#[pymethods]
impl PublicIds {
    #[new]
    #[pyo3(signature = (config_json = None, config_file = None))]
    fn new(py: Python<'_>, config_json: Option<String>, config_file: Option<PathBuf>) -> PyResult<Self> {
        let inner = py
            .detach(|| idgen_sdk::PublicIds::from_settings(config_json.as_deref(), config_file.as_deref()))
            .map_err(|e| raise(py, e))?;
        Ok(PublicIds { inner })
    }

    /// Lets go of its connections; every call after it raises `IdgenError` (closed).
    fn close(&self) {
        self.inner.close();
    }

    #[pyo3(signature = (internal_id, *, format = None, r#type = None))]
    fn create<'py>(
        &self,
        py: Python<'py>,
        internal_id: &Bound<'py, PyAny>,
        format: Option<String>,
        r#type: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = read_id(py, internal_id)?;
        let (made, created) = py
            .detach(|| self.inner.create(id.input(), format.as_deref(), r#type.as_deref()))
            .map_err(|e| raise(py, e))?;
        mapping(py, made, Some(created))
    }

    fn resolve<'py>(&self, py: Python<'py>, public_id: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let found = py.detach(|| self.inner.resolve(public_id)).map_err(|e| raise(py, e))?;
        found.map(|m| mapping(py, m, None)).transpose()
    }

    #[pyo3(signature = (internal_id, *, format = None, r#type = None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        internal_id: &Bound<'py, PyAny>,
        format: Option<String>,
        r#type: Option<String>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let id = read_id(py, internal_id)?;
        let found = py
            .detach(|| self.inner.lookup(id.input(), format.as_deref(), r#type.as_deref()))
            .map_err(|e| raise(py, e))?;
        found.map(|m| mapping(py, m, None)).transpose()
    }
}

/// `id` taken apart under the built-in schedule (development; a generator's or a client's
/// `decode` uses the registry's), naming regions from `regions`.
#[pyfunction]
#[pyo3(signature = (id, *, regions = None))]
fn decode<'py>(
    py: Python<'py>,
    id: &Bound<'py, PyAny>,
    regions: Option<HashMap<u32, String>>,
) -> PyResult<Bound<'py, PyAny>> {
    let id = read_id(py, id)?;
    let answer = idgen_sdk::decode(id.input(), &regions.unwrap_or_default()).map_err(|e| raise(py, e))?;
    decoded(py, answer)
}

/// The built-in schedule: one dict per layout.
#[pyfunction]
fn default_schedule(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    idgen_sdk::default_schedule()
        .into_iter()
        .map(|entry| {
            let dict = PyDict::new(py);
            dict.set_item("layout", entry.layout)?;
            dict.set_item("region_bits", entry.region_bits)?;
            dict.set_item("machine_bits", entry.machine_bits)?;
            dict.set_item("sequence_bits", entry.sequence_bits)?;
            dict.set_item("from_unix_ms", entry.from_unix_ms)?;
            Ok(dict)
        })
        .collect()
}

/// A TypeID's prefix (empty for none) and its UUID.
#[pyfunction]
fn parse_typeid<'py>(py: Python<'py>, text: &str) -> PyResult<(String, Bound<'py, PyAny>)> {
    match idgen_sdk::typeid::parse_typeid(text) {
        Some((prefix, bytes)) => Ok((prefix.to_owned(), uuid(py, &bytes)?)),
        None => Err(raise(py, invalid("invalid_typeid", format!("{text:?} is not a TypeID")))),
    }
}

/// The TypeID of `prefix` (empty for none) and a UUID.
#[pyfunction]
fn typeid_text(py: Python<'_>, prefix: &str, uuid: &Bound<'_, PyAny>) -> PyResult<String> {
    let value: u128 = match uuid.is_instance(UUID.import(py, "uuid", "UUID")?)? {
        true => uuid.getattr("int")?.extract()?,
        false => {
            let kind = uuid.get_type().name()?;
            return Err(raise(py, invalid("invalid_typeid", format!("a TypeID's UUID is a uuid.UUID, not {kind}"))));
        }
    };
    idgen_sdk::typeid::typeid_text(prefix, &value.to_be_bytes())
        .ok_or_else(|| raise(py, invalid("invalid_typeid", format!("{prefix:?} is not a TypeID prefix"))))
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_class::<EmbeddedGenerator>()?;
    module.add_class::<Client>()?;
    module.add_class::<PublicIds>()?;
    module.add_function(wrap_pyfunction!(decode, module)?)?;
    module.add_function(wrap_pyfunction!(default_schedule, module)?)?;
    module.add_function(wrap_pyfunction!(parse_typeid, module)?)?;
    module.add_function(wrap_pyfunction!(typeid_text, module)?)?;
    module.add("MAX_COUNT", MAX_COUNT)?;
    module.add("DEFAULT_ENV_PREFIX", idgen_sdk::DEFAULT_ENV_PREFIX)?;
    Ok(())
}
