//! Errors in OpenAI's format: an HTTP status and the body
//! `{"error": {"message", "type", "param", "code"}}` (OpenAI API reference, "Error codes").

use std::error::Error;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tower_http::timeout::TimeoutError;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// 400 for a bad request, 404 for an unknown model or route, 408 for a body that does
    /// not arrive in time, 413 for a body or a reservation over the limits, 429 when the
    /// memory budget is taken, 503 when the queue or the connections are full, 504 past the
    /// request's deadline, 500 when generation fails.
    pub status: StatusCode,
    /// What is wrong, for a person.
    pub message: String,
    /// `invalid_request_error`, `server_error`...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// An error with `status`, `code` and `message`, of type `invalid_request_error` for
    /// a 4xx status and `server_error` otherwise.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: if status.is_client_error() {
                "invalid_request_error"
            } else {
                "server_error"
            },
            param: None,
            code: Some(code),
        }
    }

    /// A 504 for a request still running at its deadline, `timeout` after its arrival.
    pub fn deadline(timeout: Duration) -> ApiError {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "the request did not finish within the server's deadline of {} s \
                 (--request-timeout)",
                timeout.as_secs_f64()
            ),
        )
    }

    /// The same error with `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// A 404 for a model that is not the served one.
    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{model}` does not exist"),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }
    }

    /// A 503 when the server cannot take the request now: its queue is full, or its
    /// engine has stopped.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("server_unavailable"),
        }
    }

    /// A 500 for a generation that failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: Option<&'a str>,
        }
        serde_json::json!({
            "error": Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// A body over axum's limit (2 MiB): 413. A body whose next bytes did not come within the
/// body timeout (tower-http's [`TimeoutError`]): 408. A body that is not JSON, or JSON that
/// does not fit the request type (a missing field, a value of the wrong type): 400 with
/// serde's message. axum would answer in plain text, and 415/422 for the latter.
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let mut cause: Option<&(dyn Error + 'static)> = Some(&rejection);
        while let Some(e) = cause {
            if e.is::<TimeoutError>() {
                return ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    "the request body stopped arriving before its end (--body-timeout)",
                );
            }
            cause = e.source();
        }
        let mut error = ApiError::invalid(None, rejection.body_text());
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            error.status = StatusCode::PAYLOAD_TOO_LARGE;
            error.code = Some("request_too_large");
        }
        error
    }
}
