//! Errors on the gRPC binding: the status code of the one error table, and the A2A error as
//! a `google.rpc.Status` in `grpc-status-details-bin`, whose `ErrorInfo` carries the A2A
//! reason, as the spec maps them.

use bytes::Bytes;
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::error::GatewayError;
use crate::protocol::grpc::{ErrorInfo, RpcStatus, ERROR_INFO_TYPE};

/// `error` as the gRPC status it answers with.
pub(crate) fn status_of(error: &GatewayError) -> Status {
    if let GatewayError::Internal(detail) = error {
        tracing::error!(%detail, "internal error");
    }
    crate::telemetry::note(|c| c.error = Some((error.code(), error.reason())));
    let code = Code::from_i32(error.grpc_code() as i32);
    let message = error.public_message();
    let (reason, domain, metadata) = error.error_info();
    let info = ErrorInfo {
        reason: reason.into(),
        domain: domain.into(),
        metadata: metadata.into_iter().collect(),
    };
    let details = RpcStatus {
        code: code as i32,
        message: message.clone(),
        details: vec![prost_types::Any {
            type_url: ERROR_INFO_TYPE.into(),
            value: info.encode_to_vec(),
        }],
    };
    let mut status = Status::with_details(code, message, Bytes::from(details.encode_to_vec()));
    let md = status.metadata_mut();
    if let Some(secs) = error.retry_after() {
        md.insert("retry-after", MetadataValue::from(secs));
    }
    if let Some(Ok(challenge)) = error.challenge().map(str::parse) {
        md.insert("www-authenticate", challenge);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info_of(status: &Status) -> ErrorInfo {
        let details = RpcStatus::decode(status.details()).unwrap();
        assert_eq!(details.code, status.code() as i32);
        assert_eq!(details.details[0].type_url, ERROR_INFO_TYPE);
        ErrorInfo::decode(details.details[0].value.as_slice()).unwrap()
    }

    #[test]
    fn a2a_errors_map_as_the_spec_says_with_their_reason() {
        let cases = [
            (
                GatewayError::TaskNotFound("t".into()),
                Code::NotFound,
                "TASK_NOT_FOUND",
            ),
            (
                GatewayError::TaskNotCancelable {
                    id: "t".into(),
                    state: "completed",
                },
                Code::FailedPrecondition,
                "TASK_NOT_CANCELABLE",
            ),
            (
                GatewayError::PushNotSupported,
                Code::FailedPrecondition,
                "PUSH_NOTIFICATION_NOT_SUPPORTED",
            ),
            (
                GatewayError::UnsupportedOperation("x".into()),
                Code::FailedPrecondition,
                "UNSUPPORTED_OPERATION",
            ),
            (
                GatewayError::InvalidParams("x".into()),
                Code::InvalidArgument,
                "INVALID_PARAMS",
            ),
            (
                GatewayError::Forbidden,
                Code::PermissionDenied,
                "PERMISSION_DENIED",
            ),
            (
                GatewayError::RateLimited {
                    scope: "caller",
                    retry_after: 3,
                },
                Code::ResourceExhausted,
                "RATE_LIMITED",
            ),
            (
                GatewayError::DeadlineExceeded("1S".into()),
                Code::DeadlineExceeded,
                "DEADLINE_EXCEEDED",
            ),
            (
                GatewayError::Internal("secret".into()),
                Code::Internal,
                "INTERNAL",
            ),
        ];
        for (error, code, reason) in cases {
            let status = status_of(&error);
            assert_eq!(status.code(), code, "{error:?}");
            assert_eq!(info_of(&status).reason, reason, "{error:?}");
        }
        let task = status_of(&GatewayError::TaskNotFound("t-1".into()));
        assert_eq!(info_of(&task).domain, "a2a-protocol.org");
        assert_eq!(info_of(&task).metadata["taskId"], "t-1");
        let limited = status_of(&GatewayError::RateLimited {
            scope: "caller",
            retry_after: 3,
        });
        assert_eq!(limited.metadata().get("retry-after").unwrap(), "3");
        // The detail of an internal error stays in the log.
        assert!(!status_of(&GatewayError::Internal("secret".into()))
            .message()
            .contains("secret"));
    }
}
