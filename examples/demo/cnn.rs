//! The demo's network (`examples/train.rs`), shared with the test that logs its step with memory
//! history on and off, so that test follows the demo.
use tch::nn::{self, Module};

/// conv(1->16) - relu - pool - conv(16->32) - relu - pool - linear(32*7*7 -> 64) - relu - linear(64 -> 10)
pub fn cnn(p: &nn::Path) -> impl Module {
    nn::seq()
        .add(nn::conv2d(p / "conv1", 1, 16, 3, nn::ConvConfig { padding: 1, ..Default::default() }))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(nn::conv2d(p / "conv2", 16, 32, 3, nn::ConvConfig { padding: 1, ..Default::default() }))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(p / "fc1", 32 * 7 * 7, 64, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", 64, 10, Default::default()))
}
