//! The MMDS data store (Firecracker's `PUT`/`PATCH`/`GET /mmds`): one JSON document, at most
//! [`MAX_DATA_BYTES`] serialised, changed whole (`PUT`) or by a JSON merge patch (`PATCH`,
//! RFC 7396); and the V2 session tokens the guest asks for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Most bytes of the document, serialised (Firecracker's default `mmds_size_limit`).
pub const MAX_DATA_BYTES: usize = 51200;

/// The process's limit on the document (Firecracker's `--mmds-size-limit`).
static LIMIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(MAX_DATA_BYTES);

/// Sets the largest document, serialised, for every MMDS of the process.
pub fn set_size_limit(bytes: usize) {
    LIMIT.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The largest document, serialised.
pub fn size_limit() -> usize {
    LIMIT.load(std::sync::atomic::Ordering::Relaxed)
}
/// Longest life of a session token (Firecracker's and IMDS's: six hours).
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(21600);
/// Most tokens alive at once; the oldest goes for a new one.
const MAX_TOKENS: usize = 1024;

/// Why the store refused a change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The document would be larger than the limit ([`size_limit`]): its size and the limit.
    #[error("the MMDS data store's limit of {1} bytes would be exceeded ({0} bytes)")]
    TooLarge(usize, usize),
    /// A `PATCH` before any `PUT`.
    #[error("The MMDS data store is not initialized.")]
    NotInitialized,
}

/// The document and the session tokens handed out.
#[derive(Debug, Default)]
pub struct Store {
    data: Option<Value>,
    /// Token → when it expires.
    tokens: HashMap<String, Instant>,
}

impl Store {
    /// `PUT /mmds`: the whole document.
    pub fn put(&mut self, data: Value) -> Result<(), StoreError> {
        check_size(&data)?;
        self.data = Some(data);
        Ok(())
    }

    /// `PATCH /mmds`: a JSON merge patch (RFC 7396) of the document; nothing changes when the
    /// result would be too large.
    pub fn patch(&mut self, patch: &Value) -> Result<(), StoreError> {
        let mut data = self.data.clone().ok_or(StoreError::NotInitialized)?;
        merge(&mut data, patch);
        check_size(&data)?;
        self.data = Some(data);
        Ok(())
    }

    /// `GET /mmds`: the document (an empty object before any `PUT`, as Firecracker answers).
    pub fn get(&self) -> Value {
        self.data
            .clone()
            .unwrap_or_else(|| Value::Object(Default::default()))
    }

    /// The value at `path` (`/a/b`: the document's `a`'s `b`), if any.
    pub fn lookup(&self, path: &str) -> Option<&Value> {
        let mut value = self.data.as_ref()?;
        for key in path.split('/').filter(|key| !key.is_empty()) {
            value = value.as_object()?.get(key)?;
        }
        Some(value)
    }

    /// A new session token that lives `ttl` from `now`.
    pub fn new_token(&mut self, ttl: Duration, now: Instant) -> String {
        self.tokens.retain(|_, expiry| *expiry > now);
        if self.tokens.len() >= MAX_TOKENS {
            if let Some(oldest) = self
                .tokens
                .iter()
                .min_by_key(|(_, expiry)| **expiry)
                .map(|(token, _)| token.clone())
            {
                self.tokens.remove(&oldest);
            }
        }
        let mut bytes = [0u8; 32];
        // The host's getrandom; a failure leaves a token nobody can guess either way: refuse
        // it by making it expire at once.
        let random = crate::entropy::host_random(&mut bytes).is_ok();
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let expiry = if random { now + ttl } else { now };
        self.tokens.insert(token.clone(), expiry);
        token
    }

    /// Whether `token` was handed out and is still alive at `now`.
    pub fn token_valid(&self, token: &str, now: Instant) -> bool {
        self.tokens.get(token).is_some_and(|expiry| *expiry > now)
    }
}

fn check_size(data: &Value) -> Result<(), StoreError> {
    let size = serde_json::to_vec(data).map_or(usize::MAX, |bytes| bytes.len());
    if size > size_limit() {
        return Err(StoreError::TooLarge(size, size_limit()));
    }
    Ok(())
}

/// RFC 7396: an object patch merges key by key (null removes), anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_patch_merges_as_rfc_7396_says() {
        let mut store = Store::default();
        assert_eq!(store.patch(&json!({})), Err(StoreError::NotInitialized));
        assert_eq!(store.get(), json!({}));
        store
            .put(json!({"latest": {"meta-data": {"ami-id": "ami-1", "gone": 1}}, "x": [1]}))
            .unwrap();
        store
            .patch(&json!({"latest": {"meta-data": {"ami-id": "ami-2", "gone": null}}, "x": 5}))
            .unwrap();
        assert_eq!(
            store.get(),
            json!({"latest": {"meta-data": {"ami-id": "ami-2"}}, "x": 5})
        );
        assert_eq!(
            store.lookup("/latest/meta-data/ami-id"),
            Some(&json!("ami-2"))
        );
        assert_eq!(store.lookup("/latest/nothing"), None);
        assert_eq!(store.lookup("/x/y"), None);
    }

    #[test]
    fn the_document_stays_within_its_limit() {
        let mut store = Store::default();
        let big = "x".repeat(MAX_DATA_BYTES);
        assert!(matches!(
            store.put(json!({ "big": big })),
            Err(StoreError::TooLarge(..))
        ));
        store.put(json!({"small": 1})).unwrap();
        assert!(store.patch(&json!({ "big": big })).is_err());
        assert_eq!(store.get(), json!({"small": 1}), "unchanged");
    }

    #[test]
    fn tokens_live_as_long_as_asked() {
        let mut store = Store::default();
        let now = Instant::now();
        let token = store.new_token(Duration::from_secs(10), now);
        assert_eq!(token.len(), 64);
        assert!(store.token_valid(&token, now + Duration::from_secs(9)));
        assert!(!store.token_valid(&token, now + Duration::from_secs(10)));
        assert!(!store.token_valid("forged", now));
        let other = store.new_token(Duration::from_secs(10), now);
        assert_ne!(token, other);
    }
}
