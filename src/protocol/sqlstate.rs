//! SQLSTATE codes the pooler itself reports.

pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CONNECTION_FAILURE: &str = "08006";
pub const INVALID_PASSWORD: &str = "28P01";
pub const INVALID_AUTHORIZATION: &str = "28000";
pub const INVALID_CATALOG_NAME: &str = "3D000";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const ADMIN_SHUTDOWN: &str = "57P01";
pub const QUERY_CANCELED: &str = "57014";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const INTERNAL_ERROR: &str = "XX000";
