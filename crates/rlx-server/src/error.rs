//! OpenAI-style errors: `{"error": {"message", "type", "code"}}` with an
//! HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// A short machine-readable code (`model_not_found`, `queue_full`, ...).
    pub code: &'static str,
}

impl ApiError {
    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
    }

    /// An error of any status, type and code.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
        }
    }

    /// 404 for a `model` that is not loaded.
    pub fn unknown_model(name: &str, loaded: &[String]) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("model '{name}' is not served here; loaded: {loaded:?}"),
        )
    }

    /// 429 with `Retry-After`: the queue is full.
    pub fn queue_full(what: &str) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            format!("the {what} queue is full; retry later"),
        )
    }

    /// 503 while the models load and warm up.
    pub fn loading() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "loading",
            "the models are still loading; see GET /health",
        )
    }

    /// 500 for a failure inside the server (a model run that failed).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message,
        )
    }

    /// 408 when the request ran past `--timeout`.
    pub fn timeout(secs: f64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            "timeout",
            format!("the request ran past the server's timeout of {secs} s"),
        )
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message, "type": self.kind, "code": self.code, "param": null}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.status == StatusCode::TOO_MANY_REQUESTS;
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if retry {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
