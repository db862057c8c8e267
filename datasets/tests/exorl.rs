//! ExoRL layout: NumPy-written fixtures load with the right stats, bad files are errors naming the
//! file, our writer round-trips, and collection is deterministic with rewards in [0, 1].

use datasets::exorl::{
    EPISODE_STEPS, ExorlError, Policy, TASKS, collect, episode_files, make_env, read_episode,
    write_episode,
};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/exorl")
}

#[test]
fn numpy_written_episodes_give_numpys_stats() {
    let root = fixtures();
    let expected = std::fs::read_to_string(root.join("expected_stats.csv")).unwrap();
    let files = episode_files(&root.join("good")).unwrap();
    assert_eq!(files.len(), expected.lines().count() - 1);
    for line in expected.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let episode = read_episode(&root.join(f[0])).unwrap();
        assert_eq!(episode.steps(), f[1].parse::<usize>().unwrap(), "{line}");
        let numpy_return: f64 = f[2].parse().unwrap();
        assert!(
            (episode.total_return() - numpy_return).abs() <= 1e-6 * numpy_return.abs().max(1.0),
            "{line}: {}",
            episode.total_return()
        );
        assert_eq!(episode.observation.cols, f[3].parse::<usize>().unwrap());
        assert_eq!(episode.action.cols, f[4].parse::<usize>().unwrap());
        assert_eq!(episode.physics.rows, episode.steps() + 1);
        assert_eq!(
            episode.action.row(0),
            vec![0.0; episode.action.cols].as_slice()
        );
    }
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let bad = fixtures().join("bad");
    let read = |dir: &str| {
        let path = episode_files(&bad.join(dir)).unwrap().remove(0);
        let error = read_episode(&path).unwrap_err();
        assert!(
            error.to_string().contains(path.to_str().unwrap()),
            "{error}"
        );
        error
    };
    assert!(matches!(
        read("missing_key"),
        ExorlError::MissingKey { key: "physics", .. }
    ));
    assert!(matches!(
        read("mismatch"),
        ExorlError::LengthMismatch {
            key: "reward",
            rows: 5,
            expected: 6,
            ..
        }
    ));
    assert!(matches!(read("truncated"), ExorlError::Corrupt { .. }));
    let empty = std::env::temp_dir().join(format!("ringbench-exorl-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(matches!(
        episode_files(&empty),
        Err(ExorlError::Empty { .. })
    ));
}

#[test]
fn collection_is_deterministic_round_trips_and_rewards_lie_in_unit_interval() {
    let dir = std::env::temp_dir().join(format!("ringbench-exorl-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for task in TASKS {
        let mut env = make_env(task).unwrap();
        for policy in Policy::ALL {
            let a = collect(env.as_mut(), policy, 2, 10, 3);
            let b = collect(env.as_mut(), policy, 2, 10, 3);
            assert_eq!(a, b, "{task} {}", policy.name());
            assert_ne!(
                a[0],
                a[1],
                "{task} {}: episodes differ by seed",
                policy.name()
            );
            for episode in &a {
                assert_eq!(episode.steps(), EPISODE_STEPS);
                assert_eq!(episode.observation.cols, env.obs_dim());
                assert!(episode.reward.iter().all(|r| (0.0..=1.0).contains(r)));
                assert_eq!(episode.reward[0], 0.0);
            }
            let path = dir.join(format!("{task}_{}_0_1000.npz", policy.name()));
            write_episode(&path, &a[0]).unwrap();
            assert_eq!(read_episode(&path).unwrap(), a[0]);
        }
    }
    assert!(matches!(
        make_env("walker_walk"),
        Err(ExorlError::UnknownTask { .. })
    ));
}

#[test]
fn the_scripted_controller_beats_random_actions() {
    for task in TASKS {
        let mut env = make_env(task).unwrap();
        let mut mean = |policy| {
            let episodes = collect(env.as_mut(), policy, 6, 20, 11);
            episodes.iter().map(|e| e.total_return()).sum::<f64>() / episodes.len() as f64
        };
        let (random, scripted) = (mean(Policy::Random), mean(Policy::Scripted));
        println!("{task}: random {random:.1}, scripted {scripted:.1}");
        assert!(scripted > 1.5 * random, "{task}: {scripted} vs {random}");
    }
}
