//! Code generation for `#[track_memory]`.
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ItemFn;

use crate::TrackMemoryArgs;

/// `&'static Site` for the line of `span`, marked ` (enter)` or ` (exit)`: the tracker's own
/// `__site!`, so a call site is named one way.
fn site_at(span: Span, mark: &str) -> TokenStream {
    // `line!()` takes the line of the span it is written with.
    let line = quote_spanned!(span=> ::core::line!());
    quote!(::gpu_mem_track::__site!(#line, ::core::option::Option::Some(#mark)))
}

pub(crate) fn track_memory(args: TrackMemoryArgs, func: ItemFn) -> TokenStream {
    let ItemFn { attrs, vis, sig, block } = func;
    let entry = site_at(sig.ident.span(), "enter");
    let exit = site_at(block.brace_token.span.close(), "exit");
    let tracker = match &args.tracker {
        Some(expr) => quote!({
            let __gmt_tracker: &::gpu_mem_track::MemTracker = &#expr;
            ::core::result::Result::Ok(__gmt_tracker)
        }),
        None => quote!(::gpu_mem_track::__private::FunctionGuard::default_tracker()),
    };
    let stmts = &block.stmts;
    quote! {
        #(#attrs)*
        #vis #sig {
            let __gmt_guard = ::gpu_mem_track::__private::FunctionGuard::enter(#tracker, #entry, #exit);
            #(#stmts)*
        }
    }
}
