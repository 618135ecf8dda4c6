//! Every word an estimate takes, by the option that takes it: the one list the command line and
//! the Python package read. Each option's words are its Rust type's ([`Choice::NAMES`], the log's
//! categories and phases), so a word is added to its type and appears everywhere.
use gpu_mem_track_gpu::options::{Choice, EstimateDevice, FitDimension, Lifetimes, Optimizer, Precision};
use gpu_mem_track_gpu::profile::AUTO;
use gpu_mem_track_gpu::sharding::{Shard, TrainingPrecision};
use gpu_mem_track_log::{Category, Phase};

/// The GPU target's words that name no single GPU (`--device-profile`, Python's
/// `device_profile`): the caching allocator model alone, every preset, no CUDA figures. `fit`
/// takes none of them. See [`GpuTarget`](crate::gpu_target::GpuTarget).
pub const NOT_ONE_GPU: [&str; 3] = ["cuda", "all", "none"];

/// The GPU an estimate is for when none is named, on the command line and in Python.
pub const DEFAULT_GPU_TARGET: &str = AUTO;

/// One option's words: what it lists, and how it reads a word.
struct OptionWords {
    name: &'static str,
    words: fn() -> Vec<String>,
    canonical: fn(&str) -> Result<String, String>,
}

const fn choice<T: Choice>(name: &'static str) -> OptionWords {
    fn words<T: Choice>() -> Vec<String> {
        T::NAMES.iter().map(|n| (*n).to_owned()).collect()
    }
    fn canonical<T: Choice>(value: &str) -> Result<String, String> {
        value.parse::<T>().map(|v| v.to_string())
    }
    OptionWords { name, words: words::<T>, canonical: canonical::<T> }
}

fn category_words() -> Vec<String> {
    Category::ALL.iter().map(|c| c.name().to_owned()).collect()
}

/// Every option, in [`OPTIONS`]'s order: the one place an option's words come from.
const TABLE: [OptionWords; 9] = [
    choice::<Optimizer>("optimizer"),
    choice::<Precision>("dtype"),
    choice::<TrainingPrecision>("precision"),
    choice::<Shard>("shard"),
    choice::<Lifetimes>("lifetimes"),
    choice::<EstimateDevice>("device"),
    choice::<FitDimension>("dimension"),
    OptionWords {
        name: "category",
        words: category_words,
        canonical: |value| {
            Category::from_name(value)
                .map(|c| c.name().to_owned())
                .ok_or_else(|| format!("unknown category {value:?} (use {})", category_words().join(", ")))
        },
    },
    OptionWords {
        name: "phase",
        words: || Phase::ALL.iter().map(|p| p.to_string()).collect(),
        canonical: |value| value.parse::<Phase>().map(|p| p.to_string()),
    },
];

/// The options whose words are listed, as the command line and Python name them.
pub const OPTIONS: [&str; 9] = {
    let mut names = [""; 9];
    let mut i = 0;
    while i < TABLE.len() {
        names[i] = TABLE[i].name;
        i += 1;
    }
    names
};

fn option(name: &str) -> Option<&'static OptionWords> {
    TABLE.iter().find(|o| o.name == name)
}

/// The canonical words of `option` (one of [`OPTIONS`]), `None` for another option.
pub fn words(option_name: &str) -> Option<Vec<String>> {
    option(option_name).map(|o| (o.words)())
}

/// The canonical word of `value` for `option`: an alias or another spelling (`sgd-momentum`,
/// `AMP_BF16`) gives its type's name (`momentum`, `amp-bf16`).
///
/// # Errors
/// The type's own message for an unknown word (it lists the words), or an unknown option.
pub fn canonical(option_name: &str, value: &str) -> Result<String, String> {
    match option(option_name) {
        Some(o) => (o.canonical)(value),
        None => Err(format!("unknown option {option_name:?} (use {})", OPTIONS.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// JSON spells every value as the text does: each `Choice`'s serde name is its `Display`.
    fn spelled_alike<T: Choice + serde::Serialize>() {
        for name in T::NAMES {
            let v: T = name.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(v.to_string()), "{name}");
            assert_eq!(v.to_string(), *name);
        }
        for (name, aliases) in T::NAMES.iter().zip(T::ALIASES) {
            for alias in *aliases {
                assert_eq!(alias.parse::<T>().map(|v| v.to_string()).as_deref(), Ok(*name), "{alias}");
            }
        }
    }

    #[test]
    fn every_choice_is_spelled_in_json_as_in_text() {
        spelled_alike::<Optimizer>();
        spelled_alike::<Precision>();
        spelled_alike::<TrainingPrecision>();
        spelled_alike::<Shard>();
        spelled_alike::<Lifetimes>();
        spelled_alike::<EstimateDevice>();
        spelled_alike::<FitDimension>();
        assert_eq!(serde_json::to_value(Optimizer::SgdMomentum).unwrap(), "momentum");
        for p in Phase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), serde_json::json!(p.to_string()));
            assert_eq!(p.to_string().parse::<Phase>(), Ok(p));
        }
        assert_eq!(serde_json::to_value(Phase::Unmarked).unwrap(), "run");
        for c in Category::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::json!(c.name()));
        }
    }

    #[test]
    fn every_option_lists_its_words_and_takes_each_spelling() {
        for option in OPTIONS {
            let words = words(option).unwrap_or_else(|| panic!("{option}"));
            assert!(!words.is_empty(), "{option}");
            for w in &words {
                assert_eq!(canonical(option, w).as_deref(), Ok(w.as_str()), "{option} {w}");
            }
        }
        assert_eq!(canonical("optimizer", "sgd-momentum").as_deref(), Ok("momentum"));
        assert_eq!(canonical("precision", "AMP_BF16").as_deref(), Ok("amp-bf16"));
        assert_eq!(canonical("phase", "optimizer").as_deref(), Ok("optimizer step"));
        let lion = canonical("optimizer", "lion").unwrap_err();
        assert!(lion.contains("lion") && lion.contains("adamw"), "{lion}");
        assert!(canonical("category", "weights").unwrap_err().contains("optimizer_state"));
        assert!(canonical("colour", "red").unwrap_err().contains("optimizer"));
        assert_eq!(words("colour"), None);
    }

    #[test]
    fn the_gpu_target_words_resolve_as_they_say() {
        for word in NOT_ONE_GPU {
            let target = crate::GpuTarget::resolve(word, None).unwrap();
            assert!(!matches!(target, crate::GpuTarget::One(_)), "{word}: {target:?}");
        }
        let default = crate::GpuTarget::resolve(DEFAULT_GPU_TARGET, None).unwrap();
        assert!(matches!(default, crate::GpuTarget::One(_)), "{default:?}");
    }
}
