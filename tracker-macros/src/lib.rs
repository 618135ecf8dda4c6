//! Procedural macros of gpu-mem-track. `lib.rs` parses the attribute; `expand.rs` generates code.
//!
//! Use them through the `gpu-mem-track` crate (`gpu_mem_track::track_memory`), which these
//! expansions refer to by path.
use proc_macro::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{parse_macro_input, Expr, ItemFn, Token};

mod expand;

/// Arguments of `#[track_memory]`: nothing, or `tracker = <expr>`.
pub(crate) struct TrackMemoryArgs {
    pub(crate) tracker: Option<Expr>,
}

impl Parse for TrackMemoryArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            return Ok(TrackMemoryArgs { tracker: None });
        }
        let key: syn::Ident = input.parse()?;
        if key != "tracker" {
            return Err(syn::Error::new(key.span(), "unknown argument: expected `tracker = <expr>`"));
        }
        input.parse::<Token![=]>()?;
        let tracker: Expr = input.parse()?;
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after `tracker = <expr>`"));
        }
        Ok(TrackMemoryArgs { tracker: Some(tracker) })
    }
}

/// Tracks memory on entry to the function and on every exit from it (`return`, `?`, the end of
/// the body, and unwinding). The entry point is the function's name line, the exit point its
/// closing brace.
///
/// ```rust,ignore
/// #[gpu_mem_track::track_memory]
/// fn train_step(model: &Net, batch: &Tensor) -> Tensor { ... }
///
/// #[gpu_mem_track::track_memory(tracker = self.tracker)]
/// fn forward(&self, x: &Tensor) -> Tensor { ... }
/// ```
#[proc_macro_attribute]
pub fn track_memory(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = parse_macro_input!(args as TrackMemoryArgs);
    let func = parse_macro_input!(item as ItemFn);
    expand::track_memory(args, func).into()
}
