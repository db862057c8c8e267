//! The largest and smallest of a table's numbers, where a NaN cannot hide (`f64::max` drops it) and a
//! set of negative numbers is not topped by a zero start.

/// The largest of `values`: NaN if any is NaN, `None` if there are none.
pub fn largest(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    values.into_iter().reduce(|a, b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    })
}

/// The smallest of `values`: NaN if any is NaN, `None` if there are none.
pub fn smallest(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    largest(values.into_iter().map(|x| -x)).map(|x| -x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_anywhere_is_the_answer_and_negative_numbers_stay_negative() {
        assert_eq!(largest([1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(largest([-4.0, -2.5]), Some(-2.5));
        assert_eq!(smallest([-4.0, -2.5]), Some(-4.0));
        assert_eq!(largest([]), None);
        for values in [
            [f64::NAN, 1.0, 2.0],
            [1.0, f64::NAN, 2.0],
            [1.0, 2.0, f64::NAN],
        ] {
            assert!(largest(values).unwrap().is_nan(), "{values:?}");
            assert!(smallest(values).unwrap().is_nan(), "{values:?}");
        }
        assert_eq!(largest([f64::INFINITY, 1.0]), Some(f64::INFINITY));
    }
}
