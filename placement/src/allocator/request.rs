//! [`GpuRequest`]: the `gpus` scalar of a container's resources, validated once for every caller.
//!
//! Mesos keeps scalar resources in fixed point with three decimals (`Value::Scalar` arithmetic
//! rounds to 0.001), and its isolator refuses a fractional `gpus` with `(long long)(gpus * 1000) %
//! 1000 != 0` (`docs/reference/mesos-gpu-isolator.md` §1.4). We do the same: the value is first
//! rounded to 0.001, so `2.0000000001` left by floating-point sums is 2, and `1.5` or `1.001` are
//! refused. Unlike Mesos we also refuse negative, NaN, infinite and larger-than-offered values
//! here, with one message that names the value and what is accepted.

use super::AllocError;

/// A validated whole-GPU request: a count from 0 to the number of GPUs the agent offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuRequest {
    count: u32,
}

impl GpuRequest {
    /// Validates the `gpus` scalar `value` against the `offered` GPUs; the lifecycle and the Docker
    /// bridge both call this, so both refuse the same values with the same message.
    pub fn from_scalar(value: f64, offered: u32) -> Result<GpuRequest, AllocError> {
        let bad = || AllocError::BadRequest {
            got: value,
            max: offered,
        };
        let milli = (value * 1000.0).round();
        if !milli.is_finite() || milli < 0.0 || milli % 1000.0 != 0.0 {
            return Err(bad());
        }
        let whole = milli / 1000.0;
        if whole > f64::from(offered) {
            return Err(bad());
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a whole number from 0 to `offered`, checked above: exact in u32"
        )]
        let count = whole as u32;
        Ok(GpuRequest { count })
    }

    /// The number of GPUs requested.
    pub fn count(self) -> u32 {
        self.count
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn accepts_whole_numbers_up_to_the_offer() {
        assert_eq!(GpuRequest::from_scalar(0.0, 8).unwrap().count(), 0);
        assert_eq!(GpuRequest::from_scalar(-0.0, 8).unwrap().count(), 0);
        assert_eq!(GpuRequest::from_scalar(3.0, 8).unwrap().count(), 3);
        assert_eq!(GpuRequest::from_scalar(8.0, 8).unwrap().count(), 8);
        assert_eq!(GpuRequest::from_scalar(0.0, 0).unwrap().count(), 0);
    }

    #[test]
    fn rounds_to_mesos_precision_first() {
        let sum: f64 = std::iter::repeat_n(0.1, 20).sum();
        assert_ne!(sum, 2.0);
        assert_eq!(GpuRequest::from_scalar(sum, 8).unwrap().count(), 2);
        assert_eq!(GpuRequest::from_scalar(1.0004, 8).unwrap().count(), 1);
        assert!(GpuRequest::from_scalar(1.001, 8).is_err());
    }

    #[test]
    fn refuses_with_the_value_and_the_accepted_range() {
        for (value, shown) in [
            (1.5, "1.5"),
            (-1.0, "-1"),
            (9.0, "9"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (1e20, "100000000000000000000"),
        ] {
            let err = GpuRequest::from_scalar(value, 8).unwrap_err();
            assert!(
                matches!(err, AllocError::BadRequest { max: 8, .. }),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                format!("gpus={shown}: expected a whole number from 0 to 8")
            );
        }
    }

    #[test]
    fn counts_checked_against_no_offer_are_exact_up_to_u32_max() {
        // `mig-<profile>` scalars are checked against no offer (u32::MAX).
        assert_eq!(
            GpuRequest::from_scalar(4e9, u32::MAX).unwrap().count(),
            4_000_000_000
        );
        assert!(GpuRequest::from_scalar(1e20, u32::MAX).is_err());
        assert_eq!(
            GpuRequest::from_scalar(0.9999, u32::MAX).unwrap().count(),
            1
        );
    }

    proptest! {
        #[test]
        fn accepted_values_are_whole_and_in_range(value in prop::num::f64::ANY, offered in prop_oneof![0u32..=64, Just(u32::MAX)]) {
            match GpuRequest::from_scalar(value, offered) {
                Ok(request) => {
                    prop_assert!(request.count() <= offered);
                    prop_assert!((value - f64::from(request.count())).abs() < 0.0005 + 1e-12);
                }
                Err(err) => {
                    let bad_request = matches!(err, AllocError::BadRequest { .. });
                    prop_assert!(bad_request, "{err:?}");
                }
            }
        }

        #[test]
        fn every_count_in_range_is_accepted(offered in 0u32..=64, pick in 0u32..=64) {
            let count = pick.min(offered);
            prop_assert_eq!(GpuRequest::from_scalar(f64::from(count), offered).unwrap().count(), count);
        }
    }
}
