//! redis-rs, as rein-redis uses it, against the simulated Redis inside a turmoil world.
//!
//! The client builds its connection the way the simulation's application nodes will:
//! `MultiplexedConnection::new_with_config` over a turmoil `TcpStream`, without the
//! `CLIENT SETINFO` handshake. Scripts go through `Script::invoke_async`, so a flushed or
//! restarted server exercises redis-rs's `NOSCRIPT` → `SCRIPT LOAD` → `EVALSHA` path.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, AsyncConnectionConfig, RedisConnectionInfo, Script};
use sim::redis::{Clock, Persistence, Shared, host};

/// The simulated Redis's port on the simulated network (no real socket is opened).
const PORT: u16 = 6379;

/// The simulation's wall clock starts here, so `TIME` inside scripts is known exactly.
const EPOCH_SECS: u64 = 1_700_000_000;

/// Counts a hit and reports the server's `TIME` seconds, in one atomic script.
const HIT: &str = "local n = (tonumber(redis.call('GET', KEYS[1])) or 0) + ARGV[1]\n\
                   redis.call('SET', KEYS[1], n)\n\
                   return {n, redis.call('TIME')[1]}";

fn world() -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .rng_seed(7)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(3))
        .simulation_duration(Duration::from_secs(30))
        .build()
}

async fn connect() -> Result<MultiplexedConnection, Box<dyn std::error::Error>> {
    let stream = turmoil::net::TcpStream::connect(("redis", PORT)).await?;
    let info = RedisConnectionInfo::default().set_skip_set_lib_name();
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(1)));
    let (connection, driver) =
        MultiplexedConnection::new_with_config(&info, stream, config).await?;
    tokio::spawn(driver);
    Ok(connection)
}

/// Runs the commands and scripts of one client session; returns what the scripts saw.
fn scenario() -> turmoil::Result<Vec<(i64, String)>> {
    let mut world = world();
    let redis = Shared::new(Clock::turmoil());
    world.host("redis", host(redis.clone(), PORT, Persistence::LoseData));
    let seen = Rc::new(RefCell::new(Vec::new()));
    let record = seen.clone();
    world.client("app", async move {
        let mut con = connect().await?;
        let () = con.set("k", "v").await?;
        let value: String = con.get("k").await?;
        assert_eq!(value, "v");
        let echoed: String = redis::cmd("EVAL")
            .arg("return ARGV[1]")
            .arg(0)
            .arg("x")
            .query_async(&mut con)
            .await?;
        assert_eq!(echoed, "x");

        let hit = Script::new(HIT);
        let result: (i64, String) = hit.key("c").arg(2).invoke_async(&mut con).await?;
        record.borrow_mut().push(result);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut con)
            .await?;
        // The cache is empty: invoke_async gets NOSCRIPT, loads the script and retries.
        let result: (i64, String) = hit.key("c").arg(3).invoke_async(&mut con).await?;
        record.borrow_mut().push(result);
        let cached: Vec<i64> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(hit.get_hash())
            .query_async(&mut con)
            .await?;
        assert_eq!(cached, [1]);
        Ok(())
    });
    world.run()?;
    assert_eq!(redis.execute(["GET", "c"]), sim::redis::Reply::bulk("5"));
    Ok(seen.take())
}

#[test]
fn redis_rs_runs_commands_and_scripts_against_the_simulated_redis() -> turmoil::Result {
    let seen = scenario()?;
    // The second script ran after the 1.5 s sleep: TIME is simulated, one second later.
    let expected = [
        (2, EPOCH_SECS.to_string()),
        (5, (EPOCH_SECS + 1).to_string()),
    ];
    assert_eq!(seen, expected);
    // Same seed, same world: the run is reproducible.
    assert_eq!(scenario()?, expected);
    Ok(())
}

#[test]
fn a_bounce_keeps_data_only_with_persistence_and_always_forgets_scripts() -> turmoil::Result {
    for persistence in [Persistence::KeepData, Persistence::LoseData] {
        let mut world = world();
        let redis = Shared::new(Clock::turmoil());
        world.host("redis", host(redis.clone(), PORT, persistence));
        let hit = Script::new(HIT);
        let sha = hit.get_hash().to_string();
        world.client("before", async move {
            let mut con = connect().await?;
            let _: (i64, String) = hit.key("c").arg(1).invoke_async(&mut con).await?;
            Ok(())
        });
        world.run()?;

        world.bounce("redis");
        world.client("after", async move {
            let mut con = connect().await?;
            let cached: Vec<i64> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(&sha)
                .query_async(&mut con)
                .await?;
            assert_eq!(cached, [0], "a restarted Redis has an empty script cache");
            let hits: Option<i64> = con.get("c").await?;
            let expected = match persistence {
                Persistence::KeepData => Some(1),
                Persistence::LoseData => None,
            };
            assert_eq!(hits, expected, "{persistence:?}");
            Ok(())
        });
        world.run()?;
    }
    Ok(())
}
