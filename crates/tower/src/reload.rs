//! [`Reloader`]: a layer built from a config file, and reloaded from it while it serves.
//!
//! A reload reads and validates the whole file, builds a new resilient limiter over the
//! same Redis connection and a new layer over it, and puts that in the place of the
//! serving one at once ([`RateLimitLayer::replace`]). Anything that fails leaves the layer
//! in force as it was, and says why with the file's line and field. The connection is
//! never replaced: a file whose `[redis]` table changed is refused, and needs a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use rein::ResilienceConfigError;
use thiserror::Error;

use crate::{
    BuildError, Config, ConfiguredLimiter, ConfiguredStore, LayerError, LoadError, RateLimitLayer,
};

/// The layer a [`Reloader`] serves.
pub type ConfiguredLayer = RateLimitLayer<ConfiguredLimiter>;

/// A [`RateLimitLayer`] built from a config file, with the handle that reloads it from the
/// same file: on demand ([`reload`](Self::reload), e.g. on `SIGHUP`) or when the file
/// changes ([`watch`](Self::watch), opt-in). Cheap to clone; every clone reloads the same
/// layer.
///
/// ```no_run
/// use std::time::Duration;
/// use rein_tower::Reloader;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let reloader = Reloader::load("rein.toml").await?;
/// let app: axum::Router = axum::Router::new()
///     .route("/api/search", axum::routing::get(|| async { "results" }))
///     .layer(reloader.layer());
/// // Look at the file every second; a bad edit is logged and refused.
/// let _watching = reloader.watch(Duration::from_secs(1));
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
///
/// What a reload keeps and what it starts afresh (docs/config.md, "Reload"):
/// - Counts: kept. They live in Redis under each policy's name; a policy kept by name keeps
///   what it counted, and one whose numbers changed continues from that state with the new
///   numbers (a raised limit admits the difference at once, a lowered one denies until the
///   counted units leave). A renamed policy starts empty.
/// - Requests: none fails or is counted twice. One already being decided finishes with the
///   layer it started with; every later one is decided by the new layer.
/// - The limiter's own state starts afresh: its caches, its circuit breaker (closed) and, if
///   Redis is down at that moment, its local fallback (a full share again, so one reload
///   during an outage can admit one more share per key than the outage bound).
/// - With `[leases]`: what the replaced limiter's leases hold goes back to Redis, on a task
///   (a reservation in flight at that moment is waited for, at most the flight timeout, and
///   what it grants goes back too).
#[derive(Clone)]
pub struct Reloader {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The file's length and modification time as `load` found them before reading it: a
    /// watch started later compares with this, so an edit made in between is applied.
    loaded: Option<(u64, Option<SystemTime>)>,
    store: ConfiguredStore,
    layer: ConfiguredLayer,
    /// The configuration in force and the text it was read from; held while a reload
    /// builds, so reloads run one at a time.
    current: Mutex<InForce>,
}

/// The configuration in force, and the file's text it was read from.
struct InForce {
    config: Config,
    text: String,
}

/// What a [`Reloader::reload`] that refused nothing did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// A layer built from the file now serves.
    Applied,
    /// The file's text is the one in force (touched, or saved unchanged): the layer in
    /// force keeps serving, with its limiter's breaker, caches, local fallback counts and
    /// leases (a rebuild would start them afresh: during an outage, each touch gave every
    /// key one more fallback share).
    Unchanged,
}

/// Why a layer could not be built from its file, or a reload was refused (the layer in
/// force then keeps serving, unchanged).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The file could not be read or is not valid; the error names the file, the line and
    /// the field.
    #[error("{source}")]
    Load {
        /// The config file.
        path: PathBuf,
        /// What is wrong in it.
        source: LoadError,
    },
    /// The first load could not connect to Redis or build the layer.
    #[error("{path}: {source}")]
    Build {
        /// The config file.
        path: PathBuf,
        /// What failed.
        source: BuildError,
    },
    /// The file's `[redis]` table differs from the one in force. The connection is made
    /// once: restart the process to change it.
    #[error(
        "{path}: [redis] changed; a reload keeps the connection it has, so restart to change \
         it (the config in force keeps serving)"
    )]
    RedisChanged {
        /// The config file.
        path: PathBuf,
    },
    /// The new file's policies or settings were refused by the limiter.
    #[error("{path}: {source}")]
    Limiter {
        /// The config file.
        path: PathBuf,
        /// Why.
        source: ResilienceConfigError,
    },
    /// The new file's routes or settings were refused by the layer.
    #[error("{path}: {source}")]
    Layer {
        /// The config file.
        path: PathBuf,
        /// Why.
        source: LayerError,
    },
}

impl Reloader {
    /// Loads the file at `path`, connects to its Redis and builds the layer, as
    /// [`Config::load`] then [`Config::build`] do.
    pub async fn load(path: impl AsRef<Path>) -> Result<Self, ReloadError> {
        let path = path.as_ref().to_owned();
        let loaded = fingerprint(&path);
        let (config, text) = read(&path)?;
        let built = async {
            let store = config.connect_store().await?;
            let layer = config.layer(config.limiter(store.clone())?)?;
            Ok::<_, BuildError>((store, layer))
        };
        let (store, layer) = built.await.map_err(|source| ReloadError::Build {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                loaded,
                store,
                layer,
                current: Mutex::new(InForce { config, text }),
            }),
        })
    }

    /// The layer to serve with. Every clone of it, and every service made from it, follows
    /// the reloads.
    pub fn layer(&self) -> ConfiguredLayer {
        self.inner.layer.clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        self.current().config.clone()
    }

    /// The config file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Reads the file again and, if all of it is valid and its `[redis]` table is the one
    /// in force, puts a layer built from it in the place of the serving one
    /// ([`Reload::Applied`]). A file whose text is the one in force changes nothing
    /// ([`Reload::Unchanged`]). Otherwise the layer in force keeps serving, unchanged, and
    /// the error says why. Blocks while it reads the file (no call to Redis); reloads run
    /// one at a time.
    pub fn reload(&self) -> Result<Reload, ReloadError> {
        let path = &self.inner.path;
        let mut current = self.current();
        let text = read_text(path)?;
        if text == current.text {
            tracing::debug!(path = %path.display(), "rate-limit config unchanged");
            return Ok(Reload::Unchanged);
        }
        let config = parse(path, &text)?;
        if config.redis != current.config.redis {
            return Err(ReloadError::RedisChanged { path: path.clone() });
        }
        let limiter =
            config
                .limiter(self.inner.store.clone())
                .map_err(|source| ReloadError::Limiter {
                    path: path.clone(),
                    source,
                })?;
        let layer = config.layer(limiter).map_err(|source| ReloadError::Layer {
            path: path.clone(),
            source,
        })?;
        let replaced = ConfiguredLimiter::clone(&self.inner.layer.limiter());
        self.inner.layer.replace(&layer);
        // What the replaced limiter's leases hold goes back to Redis, for the new limiter
        // to use (a task: this call does not wait on Redis). Its requests in progress
        // finish as usual, then decide through Redis. Outside a runtime, the units stay
        // counted until their windows end.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { replaced.shutdown().await });
        }
        tracing::info!(
            path = %path.display(),
            policies = config.policies.len(),
            routes = config.routes.len(),
            "rate-limit config reloaded"
        );
        *current = InForce { config, text };
        Ok(Reload::Applied)
    }

    /// Looks at the file every `every` (its length and modification time) and reloads it
    /// once a change has stayed the same for a whole `every` (a file written in place in
    /// one go is not read half done; rename a new file over the old one to be sure), logging each reload (`info`) and each refusal
    /// (`error`, with the line and field; the layer in force keeps serving). With the `metrics` feature it
    /// counts them in `rein_http_config_reloads_total{outcome}`, `reloaded`, `unchanged` or
    /// `refused`. The
    /// task ends when the last clone of this `Reloader` is dropped, or when the returned
    /// handle is aborted. Needs a tokio runtime.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let every = every.max(Duration::from_millis(10));
        let mut seen = self.inner.loaded;
        // A change seen at the last look, applied if it is still the same at this one.
        let mut settling = None;
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let now = fingerprint(&inner.path);
                // Unreadable for a moment (an editor's rename): look again next time.
                if now == seen || now.is_none() {
                    settling = None;
                    continue;
                }
                // Still being written, maybe: applied once it stays the same for a look.
                if settling != Some(now) {
                    settling = Some(now);
                    continue;
                }
                settling = None;
                seen = now;
                let reloader = Reloader { inner };
                // Reading a small file and building: short, but off the runtime's threads.
                let outcome = tokio::task::spawn_blocking(move || reloader.reload()).await;
                match outcome {
                    Ok(Ok(Reload::Applied)) => count("reloaded"),
                    Ok(Ok(Reload::Unchanged)) => count("unchanged"),
                    Ok(Err(error)) => {
                        count("refused");
                        tracing::error!(%error, "rate-limit config reload refused");
                    }
                    Err(error) => tracing::error!(%error, "rate-limit config reload failed"),
                }
            }
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, InForce> {
        // A reload that panicked left the config in force as it was.
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.inner.path)
            .field("layer", &self.inner.layer)
            .finish_non_exhaustive()
    }
}

/// The file at `path` read and validated, with its text.
fn read(path: &Path) -> Result<(Config, String), ReloadError> {
    let text = read_text(path)?;
    Ok((parse(path, &text)?, text))
}

/// The text of the file at `path` ([`Config::read_text`]), its error as a reload's.
fn read_text(path: &Path) -> Result<String, ReloadError> {
    Config::read_text(path).map_err(|source| ReloadError::Load {
        path: path.to_owned(),
        source,
    })
}

/// `text`, the file at `path`, validated: [`Config::load`] on text already read.
fn parse(path: &Path, text: &str) -> Result<Config, ReloadError> {
    Config::from_text(path, text).map_err(|source| ReloadError::Load {
        path: path.to_owned(),
        source,
    })
}

/// What changes when the file does: its length and modification time (`None` while it
/// cannot be read, e.g. half-way through an editor's rename).
fn fingerprint(path: &Path) -> Option<(u64, Option<SystemTime>)> {
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.len(), meta.modified().ok()))
}

fn count(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("rein_http_config_reloads_total", "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}
