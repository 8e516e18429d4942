//! Amazon Web Services: what the `ses-email` channel needs, pure and
//! natively tested.
//!
//! - [`sigv4`]: Signature Version 4 of a request (AWS IAM User Guide,
//!   "Create a signed AWS API request",
//!   <https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html>).
//! - [`sns`]: the signature of an Amazon SNS message posted to an HTTP(S)
//!   endpoint, checked against the X.509 certificate its `SigningCertURL`
//!   names ("Verifying the signatures of Amazon SNS messages",
//!   <https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html>).
//! - [`ses`]: SES API v2 `SendEmail`'s request body and error table, and the
//!   SES notifications (Delivery, Bounce, Complaint) SNS carries.

pub mod ses;
pub mod sigv4;
pub mod sns;
