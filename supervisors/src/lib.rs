//! OTP supervision behaviours on ractor.
