use super::*;

const MS: Duration = Duration::from_millis(1);

fn bucket(size: u64, refill_time: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: None,
        refill_time,
    })
}

#[test]
fn bytes_pass_until_the_bucket_is_empty_then_wait_for_its_refill() {
    let start = Instant::now();
    // 1000 bytes per 100 ms.
    let mut limiter = RateLimiter::new(
        RateLimiterConfig {
            bandwidth: bucket(1000, 100),
            ops: None,
        },
        start,
    );
    assert!(limiter.is_limiting());
    assert_eq!(limiter.consume(600, start), Ok(()));
    assert_eq!(limiter.consume(400, start), Ok(()));
    // Empty: 500 bytes take 50 ms to come.
    assert_eq!(limiter.consume(500, start), Err(50 * MS));
    assert_eq!(limiter.consume(500, start + 20 * MS), Err(30 * MS));
    assert_eq!(limiter.consume(500, start + 50 * MS), Ok(()));
    // A request larger than the bucket passes once it is full, and empties it.
    assert_eq!(limiter.consume(5000, start + 50 * MS), Err(100 * MS));
    assert_eq!(limiter.consume(5000, start + 150 * MS), Ok(()));
    assert_eq!(
        limiter.consume(1, start + 150 * MS),
        Err(Duration::from_micros(100))
    );
}

#[test]
fn operations_are_counted_and_both_buckets_must_hold_their_tokens() {
    let start = Instant::now();
    let mut limiter = RateLimiter::new(
        RateLimiterConfig {
            bandwidth: bucket(1 << 20, 1000),
            ops: bucket(2, 1000),
        },
        start,
    );
    assert_eq!(limiter.consume(10, start), Ok(()));
    assert_eq!(limiter.consume(10, start), Ok(()));
    // No operation left: a third waits half a second, and takes no bytes meanwhile.
    assert_eq!(limiter.consume(10, start), Err(500 * MS));
    assert_eq!(limiter.consume(10, start + 500 * MS), Ok(()));
}

#[test]
fn a_one_time_burst_is_spent_first_and_never_refilled() {
    let start = Instant::now();
    let mut limiter = RateLimiter::new(
        RateLimiterConfig {
            bandwidth: Some(TokenBucketConfig {
                size: 100,
                one_time_burst: Some(1000),
                refill_time: 100,
            }),
            ops: None,
        },
        start,
    );
    assert_eq!(limiter.consume(1000, start), Ok(()));
    assert_eq!(limiter.consume(100, start), Ok(()));
    assert_eq!(limiter.consume(100, start), Err(100 * MS));
}

#[test]
fn an_empty_or_instant_bucket_limits_nothing() {
    let start = Instant::now();
    let mut limiter = RateLimiter::new(
        RateLimiterConfig {
            bandwidth: bucket(0, 100),
            ops: bucket(10, 0),
        },
        start,
    );
    assert!(!limiter.is_limiting());
    for _ in 0..1000 {
        assert_eq!(limiter.consume(u64::MAX, start), Ok(()));
    }
    let config: RateLimiterConfig =
        serde_json::from_str(r#"{"bandwidth":{"size":1000,"refill_time":100}}"#).unwrap();
    assert_eq!(config.bandwidth, bucket(1000, 100));
    assert!(serde_json::from_str::<RateLimiterConfig>(r#"{"bandwidth":{"size":1}}"#).is_err());
}
