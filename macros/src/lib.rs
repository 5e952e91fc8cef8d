//! Attribute macros of eve-workflow: [`macro@workflow`] makes a workflow tool from an
//! `async fn`, [`macro@step`] a journaled step callable as `name(&ctx, args..).await?`, and
//! [`macro@tool`] an ordinary (non-durable) tool. Use them through the `eve` crate
//! (`eve::prelude::*`) or with `eve-core`; the generated code names whichever the calling crate
//! depends on.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Error, FnArg, Ident, ItemFn, LitStr, Meta, Pat, Token, Type};

/// Makes a workflow tool from `async fn name(ctx: WorkflowCtx, input: I) -> Result<O,
/// WorkflowError>`: the description is the doc comment, the input schema comes from `I`, the
/// workflow id is the declaring module path (crate name left out) plus the function name, and
/// the tool name is the function name. The function becomes a unit struct of the same name
/// that implements `IntoWorkflowTool`: `Registry::new("v1").with(name)`.
///
/// Options: `output_schema` (list the `Ok` type's schema as MCP's `outputSchema`; an object
/// type), `name = ".."` (tool name), `description = ".."`, `id = ".."` (keep an old workflow
/// id after moving or renaming the function), `background` (the call returns a task receipt at
/// once; the body may take `(ctx: WorkflowCtx, task: TaskHandle, input: I)` to post messages),
/// `waits_for_input` (the body waits for input in a helper function; see below), `approval`
/// (every call waits for a person's approval before the body runs: `WorkflowTool::needs_approval`)
/// or `approval = path::to::policy` (an `fn(&I) -> Approval` deciding approve, deny or ask per
/// input: `WorkflowTool::approval`).
///
/// The tool is declared to wait for input (`WorkflowTool::waits_for_input`, MCP's
/// `_meta["eve/mayWaitForInput"]`) when the body calls a method named `ask` or `agent`
/// (`ctx.ask(..)`, `ctx.agent(..)`), or with the `waits_for_input` option.
#[proc_macro_attribute]
pub fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, workflow_impl)
}

/// Makes a journaled step from `async fn name(args..) -> Result<T, StepError>` (optionally
/// taking `sc: StepCtx` or `sc: &StepCtx` first): it becomes `fn name(ctx: &WorkflowCtx,
/// args..) -> StepFuture<T>`, the arguments moved into the step (they must be `Clone + Send +
/// Sync + 'static`; each attempt gets a clone). The step name is the function name.
///
/// Options: `name = ".."`, `retries = N`, `backoff = "2s"` (the first retry's wait, checked at
/// compile time), `local` (a local step: consecutive local steps run back to back and their
/// outcomes commit in one append; a crash re-runs the uncommitted ones — see
/// `StepFuture::local`).
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, step_impl)
}

/// Makes an ordinary tool from `async fn name(ctx: ToolCtx, input: I) -> Result<O,
/// WorkflowError>`: runs once per call, cannot suspend durably. The description is the doc
/// comment; the function becomes a unit struct whose `into_tool()` gives the `Tool`, and that
/// `Registry::with` takes (`Registry::new("v1").with(name)`).
///
/// Options: `name = ".."`, `description = ".."`, `background` (each call is a durable run of
/// one journaled step running the tool: a task receipt, task notices, `task_cancel`, and a
/// restart runs the step again if its outcome was not recorded), `id = ".."` (the workflow id
/// of background runs; default the module path, crate name left out, and the function name),
/// `approval` (with `background`: every call waits for a person's approval before the tool's
/// step runs: `Tool::needs_approval`) or `approval = path::to::policy` (an `fn(&I) -> Approval`:
/// `Tool::approval`). `approval` without `background` is a compile error: an inline call has
/// no run to journal the approval in.
#[proc_macro_attribute]
pub fn tool(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args, item, tool_impl)
}

type Expander = fn(Options, ItemFn) -> syn::Result<TokenStream2>;

/// Expands the attribute; on an error, the error and the item unchanged (so the error is the
/// only one the user sees).
fn expand(args: TokenStream, item: TokenStream, f: Expander) -> TokenStream {
    let original = TokenStream2::from(item.clone());
    let result = Punctuated::<Meta, Token![,]>::parse_terminated
        .parse(args)
        .and_then(Options::parse)
        .and_then(|opts| Ok((opts, syn::parse::<ItemFn>(item)?)))
        .and_then(|(opts, item)| f(opts, item));
    match result {
        Ok(tokens) => tokens.into(),
        Err(e) => {
            let e = e.into_compile_error();
            quote!(#e #original).into()
        }
    }
}

/// The attribute's options.
#[derive(Default)]
struct Options {
    name: Option<LitStr>,
    description: Option<LitStr>,
    id: Option<LitStr>,
    background: Option<Span>,
    /// `local` on a step: its outcome commits with the next ones (see `StepFuture::local`).
    local: Option<Span>,
    retries: Option<syn::LitInt>,
    backoff: Option<LitStr>,
    output_schema: Option<Span>,
    waits_for_input: Option<Span>,
    /// `approval` (always ask) or `approval = path::to::policy`.
    approval: Option<(Span, Option<syn::Path>)>,
}

impl Options {
    fn parse(metas: Punctuated<Meta, Token![,]>) -> syn::Result<Self> {
        let mut o = Options::default();
        for meta in metas {
            match &meta {
                Meta::Path(p) if p.is_ident("background") => o.background = Some(p.span()),
                Meta::Path(p) if p.is_ident("local") => o.local = Some(p.span()),
                Meta::Path(p) if p.is_ident("output_schema") => o.output_schema = Some(p.span()),
                Meta::Path(p) if p.is_ident("waits_for_input") => {
                    o.waits_for_input = Some(p.span())
                }
                Meta::Path(p) if p.is_ident("approval") => o.approval = Some((p.span(), None)),
                Meta::NameValue(nv) if nv.path.is_ident("local") => {
                    return Err(Error::new(
                        nv.span(),
                        "`local` takes no value: write #[step(local)] (or leave it out for a normal step)",
                    ));
                }
                Meta::NameValue(nv) if nv.path.is_ident("approval") => {
                    let syn::Expr::Path(policy) = &nv.value else {
                        return Err(Error::new(
                            nv.value.span(),
                            "expected a path to the policy function: approval = path::to::policy (an fn(&Input) -> Approval)",
                        ));
                    };
                    o.approval = Some((nv.path.span(), Some(policy.path.clone())));
                }
                Meta::NameValue(nv) => {
                    let key = nv.path.get_ident().map(Ident::to_string).unwrap_or_default();
                    let syn::Expr::Lit(syn::ExprLit { lit, .. }) = &nv.value else {
                        return Err(Error::new(nv.value.span(), "expected a literal"));
                    };
                    match (key.as_str(), lit) {
                        ("name", syn::Lit::Str(s)) => o.name = Some(s.clone()),
                        ("description", syn::Lit::Str(s)) => o.description = Some(s.clone()),
                        ("id", syn::Lit::Str(s)) => o.id = Some(s.clone()),
                        ("backoff", syn::Lit::Str(s)) => o.backoff = Some(s.clone()),
                        ("retries", syn::Lit::Int(i)) => o.retries = Some(i.clone()),
                        _ => return Err(Error::new(meta.span(), "unknown option or wrong literal type: expected name = \"..\", description = \"..\", id = \"..\", background, output_schema, waits_for_input, approval, approval = path::to::policy, local, retries = N or backoff = \"2s\"")),
                    }
                }
                _ => return Err(Error::new(meta.span(), "unknown option: expected name = \"..\", description = \"..\", id = \"..\", background, output_schema, waits_for_input, approval, approval = path::to::policy, local, retries = N or backoff = \"2s\"")),
            }
        }
        Ok(o)
    }

    /// Rejects the options `allowed` does not list, naming the attribute.
    fn only(&self, attr: &str, allowed: &[&str]) -> syn::Result<()> {
        let given = [
            ("name", self.name.as_ref().map(LitStr::span)),
            ("description", self.description.as_ref().map(LitStr::span)),
            ("id", self.id.as_ref().map(LitStr::span)),
            ("background", self.background),
            ("local", self.local),
            ("retries", self.retries.as_ref().map(syn::LitInt::span)),
            ("backoff", self.backoff.as_ref().map(LitStr::span)),
            ("output_schema", self.output_schema),
            ("waits_for_input", self.waits_for_input),
            ("approval", self.approval.as_ref().map(|(span, _)| *span)),
        ];
        for (key, span) in given {
            if let (Some(span), false) = (span, allowed.contains(&key)) {
                return Err(Error::new(
                    span,
                    format!(
                        "#[{attr}] takes no `{key}` option; it takes: {}",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The path of the crate the generated code names: `eve` when the caller depends on the
/// facade, else `eve_core` (`crate` inside eve-core's own library).
fn krate() -> TokenStream2 {
    use proc_macro_crate::{crate_name, FoundCrate};
    let name = |n: String| {
        let i = Ident::new(&n, Span::call_site());
        quote!(::#i)
    };
    match crate_name("eve-workflow") {
        // Not renamed: the package's library is `eve`.
        Ok(FoundCrate::Name(n)) if n == "eve_workflow" => quote!(::eve),
        Ok(FoundCrate::Name(n)) => name(n),
        Ok(FoundCrate::Itself) => quote!(::eve),
        Err(_) => match crate_name("eve-core") {
            Ok(FoundCrate::Name(n)) => name(n),
            Ok(FoundCrate::Itself)
                if std::env::var("CARGO_CRATE_NAME").as_deref() == Ok("eve_core") =>
            {
                quote!(crate)
            }
            _ => quote!(::eve_core),
        },
    }
}

/// The last path segment of a parameter's type, looking through references.
fn type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Reference(r) => type_name(&r.elem),
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        Type::Group(g) => type_name(&g.elem),
        Type::Paren(p) => type_name(&p.elem),
        _ => None,
    }
}

fn typed(arg: &FnArg) -> syn::Result<&syn::PatType> {
    match arg {
        FnArg::Typed(t) => Ok(t),
        FnArg::Receiver(r) => Err(Error::new(
            r.span(),
            "a workflow, step or tool is a free function: remove `self`",
        )),
    }
}

/// The common checks: async, not generic.
fn check_fn(attr: &str, f: &ItemFn, what: &str) -> syn::Result<()> {
    if f.sig.asyncness.is_none() {
        return Err(Error::new(
            f.sig.fn_token.span(),
            format!(
                "#[{attr}] needs an `async fn`: write `async fn {}(..)`; {what}",
                f.sig.ident
            ),
        ));
    }
    if !f.sig.generics.params.is_empty() {
        return Err(Error::new(
            f.sig.generics.span(),
            format!("#[{attr}] functions cannot be generic: use concrete types"),
        ));
    }
    Ok(())
}

/// Rejects a `WorkflowCtx` parameter in a step or an ordinary tool.
fn no_workflow_ctx(attr: &str, f: &ItemFn) -> syn::Result<()> {
    for arg in &f.sig.inputs {
        let t = typed(arg)?;
        match type_name(&t.ty).as_deref() {
            Some("WorkflowCtx") => {
                let fix = if attr == "step" {
                    "a step takes StepCtx (`sc: &StepCtx`)"
                } else {
                    "a #[tool] takes ToolCtx; make it a #[workflow] to wait durably"
                };
                return Err(Error::new_spanned(
                    &t.ty,
                    format!("#[{attr}] cannot take a WorkflowCtx: ctx.ask/agent/sleep belong in the #[workflow] body; {fix}"),
                ));
            }
            Some("TaskHandle") => {
                return Err(Error::new_spanned(
                    &t.ty,
                    format!("#[{attr}] cannot take a TaskHandle: post_message exists only in #[workflow(background)] bodies"),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The doc comment as one string (the tool's description), or the override.
fn description(attr: &str, f: &ItemFn, o: &Options) -> syn::Result<LitStr> {
    if let Some(d) = &o.description {
        return Ok(d.clone());
    }
    let lines: Vec<String> = f
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .map(|l| l.strip_prefix(' ').unwrap_or(&l).trim_end().to_owned())
        .collect();
    let text = lines.join("\n").trim().to_owned();
    if text.is_empty() {
        return Err(Error::new(
            f.sig.ident.span(),
            format!("#[{attr}] needs a description: add a doc comment (`/// What the tool does.`) or write #[{attr}(description = \"..\")]"),
        ));
    }
    Ok(LitStr::new(&text, f.sig.ident.span()))
}

/// Splits attributes into doc comments (for the struct) and the rest (for the body).
fn split_docs(attrs: Vec<Attribute>) -> (Vec<Attribute>, Vec<Attribute>) {
    attrs.into_iter().partition(|a| a.path().is_ident("doc"))
}

fn workflow_impl(o: Options, f: ItemFn) -> syn::Result<TokenStream2> {
    o.only(
        "workflow",
        &[
            "name",
            "description",
            "id",
            "background",
            "output_schema",
            "waits_for_input",
            "approval",
        ],
    )?;
    check_fn("workflow", &f, "a workflow body awaits durable operations")?;
    let background = o.background.is_some();
    let inputs: Vec<&syn::PatType> = f.sig.inputs.iter().map(typed).collect::<syn::Result<_>>()?;
    let shape = if background {
        "(ctx: WorkflowCtx, task: TaskHandle, input: I)` or `(ctx: WorkflowCtx, input: I)"
    } else {
        "(ctx: WorkflowCtx, input: I)"
    };
    match inputs.first() {
        Some(t) if type_name(&t.ty).as_deref() == Some("WorkflowCtx") => {}
        first => {
            return Err(Error::new(
                first.map_or(f.sig.inputs.span(), |t| t.ty.span()),
                format!("a #[workflow] body's first parameter is its `ctx: WorkflowCtx`: write `async fn {}{shape}`", f.sig.ident),
            ))
        }
    }
    for t in &inputs[1..] {
        if type_name(&t.ty).as_deref() == Some("TaskHandle") && !background {
            return Err(Error::new_spanned(
                &t.ty,
                "post_message exists only in #[workflow(background)] bodies: write #[workflow(background)] to get a TaskHandle",
            ));
        }
    }
    // A background body may take the TaskHandle second; a default one never does.
    let with_task = inputs.get(1).and_then(|t| type_name(&t.ty)).as_deref() == Some("TaskHandle");
    let expected = if with_task { 3 } else { 2 };
    if inputs.len() != expected {
        return Err(Error::new(
            f.sig.inputs.span(),
            format!("a #[workflow] body takes `{shape}`: put several inputs in one struct"),
        ));
    }

    let krate = krate();
    let desc = description("workflow", &f, &o)?;
    let ident = f.sig.ident.clone();
    let fn_name = ident.to_string();
    let tool_name = o
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&fn_name, ident.span()));
    let with_id = o.id.as_ref().map(|id| quote!(.with_id(#id)));
    let new = if with_task {
        quote!(__new_background)
    } else {
        quote!(__new)
    };
    let background = (background && !with_task).then(|| quote!(.background()));
    let output_schema = match o.output_schema {
        Some(span) => {
            let ret = match &f.sig.output {
                syn::ReturnType::Type(_, ty) => ok_type(ty).cloned(),
                syn::ReturnType::Default => None,
            };
            let ok = ret.ok_or_else(|| {
                Error::new(
                    span,
                    "#[workflow(output_schema)] needs the body to return `Result<O, WorkflowError>` with O a JsonSchema struct",
                )
            })?;
            Some(quote!(.output_schema_of::<#ok>()))
        }
        None => None,
    };
    let waits = (o.waits_for_input.is_some() || calls_input_method(quote!(#f)))
        .then(|| quote!(.waits_for_input()));
    let approval = match &o.approval {
        Some((_, None)) => Some(quote!(.needs_approval())),
        Some((_, Some(policy))) => Some(quote!(.approval(#policy))),
        None => None,
    };
    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
    } = f;
    let (docs, other) = split_docs(attrs);
    sig.ident = Ident::new("__body", Span::call_site());
    Ok(quote! {
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        #vis struct #ident;

        impl #ident {
            /// The workflow body.
            #[doc(hidden)]
            #(#other)*
            #vis #sig #block
        }

        impl #krate::engine::IntoWorkflowTool for #ident {
            fn into_tool(self) -> #krate::engine::WorkflowTool {
                #krate::engine::define_workflow_tool(
                    #desc,
                    #krate::engine::Workflow::#new(::core::module_path!(), #fn_name, #ident::__body) #with_id,
                )
                .named(#tool_name)
                #background
                #output_schema
                #waits
                #approval
            }
        }
    })
}

/// Whether `tokens` call a method that waits for input: `.ask(..)` or `.agent(..)` (the
/// `WorkflowCtx` methods), at any depth.
fn calls_input_method(tokens: TokenStream2) -> bool {
    use proc_macro2::{Delimiter, TokenTree};
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    tokens.iter().enumerate().any(|(i, t)| match t {
        TokenTree::Group(g) => calls_input_method(g.stream()),
        TokenTree::Ident(name) if name == "ask" || name == "agent" => {
            let after_dot = i > 0 && matches!(&tokens[i - 1], TokenTree::Punct(p) if p.as_char() == '.');
            let called = matches!(tokens.get(i + 1), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis);
            after_dot && called
        }
        _ => false,
    })
}

fn step_impl(o: Options, f: ItemFn) -> syn::Result<TokenStream2> {
    o.only("step", &["name", "local", "retries", "backoff"])?;
    check_fn("step", &f, "a step's work runs on the worker's runtime")?;
    no_workflow_ctx("step", &f)?;
    let krate = krate();
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = f;
    let ident = sig.ident.clone();
    let name = o
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&ident.to_string(), ident.span()));
    let output = match &sig.output {
        syn::ReturnType::Type(_, ty) => ok_type(ty)
            .ok_or_else(|| Error::new(ty.span(), "a #[step] returns `Result<T, StepError>`"))?,
        syn::ReturnType::Default => {
            return Err(Error::new(
                sig.span(),
                "a #[step] returns `Result<T, StepError>`",
            ))
        }
    };

    // The StepCtx parameter (first, by value or by reference) and the moved arguments.
    let mut inputs: &[&syn::PatType] = &sig
        .inputs
        .iter()
        .map(typed)
        .collect::<syn::Result<Vec<_>>>()?;
    let mut sc_arg = quote!();
    if let Some((t, rest)) = inputs.split_first() {
        if type_name(&t.ty).as_deref() == Some("StepCtx") {
            sc_arg = if matches!(*t.ty, Type::Reference(_)) {
                quote!(&__sc,)
            } else {
                quote!(__sc,)
            };
            inputs = rest;
        }
    }
    let mut params = Vec::new();
    let mut names = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        if type_name(&t.ty).as_deref() == Some("StepCtx") {
            return Err(Error::new_spanned(
                &t.ty,
                "a #[step] takes its StepCtx as the first parameter",
            ));
        }
        let arg = match &*t.pat {
            Pat::Ident(p) => p.ident.clone(),
            _ => format_ident!("__arg{i}"),
        };
        let ty = &t.ty;
        params.push(quote!(#arg: #ty));
        names.push(arg);
    }

    let retry = match (&o.retries, &o.backoff) {
        (None, None) => quote!(),
        (retries, backoff) => {
            let retries = retries.as_ref().map(|r| quote!(max_retries: #r,));
            let backoff = match backoff {
                Some(b) => {
                    let d = humantime::parse_duration(&b.value()).map_err(|e| {
                        Error::new(b.span(), format!("backoff is not a duration ({e}): write e.g. \"500ms\", \"2s\", \"1m\""))
                    })?;
                    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                    Some(quote!(initial_backoff: ::core::time::Duration::from_millis(#ms),))
                }
                None => None,
            };
            quote!(.retry(#krate::engine::RetryPolicy {
                #retries
                #backoff
                ..::core::default::Default::default()
            }))
        }
    };

    let local = o.local.map(|_| quote!(.local()));
    let inner_inputs = &sig.inputs;
    let inner_output = &sig.output;
    Ok(quote! {
        #(#attrs)*
        #[allow(clippy::clone_on_copy, clippy::redundant_clone)]
        #vis fn #ident(ctx: &#krate::engine::WorkflowCtx, #(#params),*) -> #krate::engine::StepFuture<#output> {
            async fn __step(#inner_inputs) #inner_output #block
            ctx.step(#name, move |__sc: #krate::engine::StepCtx| {
                #(let #names = ::core::clone::Clone::clone(&#names);)*
                async move { __step(#sc_arg #(#names),*).await }
            })
            #retry
            #local
        }
    })
}

/// `T` of `Result<T, _>`.
fn ok_type(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(a) = &seg.arguments else {
        return None;
    };
    match a.args.first()? {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    }
}

fn tool_impl(o: Options, f: ItemFn) -> syn::Result<TokenStream2> {
    o.only(
        "tool",
        &["name", "description", "id", "background", "approval"],
    )?;
    if let (Some((span, _)), None) = (&o.approval, o.background) {
        return Err(Error::new(
            *span,
            "#[tool(approval)] needs `background`: an inline tool has no run to journal the approval in; write #[tool(background, approval)]",
        ));
    }
    check_fn("tool", &f, "a tool runs once per call")?;
    no_workflow_ctx("tool", &f)?;
    if f.sig.inputs.len() != 2
        || type_name(&typed(&f.sig.inputs[0])?.ty).as_deref() != Some("ToolCtx")
    {
        return Err(Error::new(
            f.sig.inputs.span(),
            format!(
                "a #[tool] takes `(ctx: ToolCtx, input: I)`: write `async fn {}(ctx: ToolCtx, input: I)`",
                f.sig.ident
            ),
        ));
    }
    let krate = krate();
    let desc = description("tool", &f, &o)?;
    let ident = f.sig.ident.clone();
    let fn_name = ident.to_string();
    let tool_name = o
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&fn_name, ident.span()));
    // The workflow id of background runs: as #[workflow]'s, module path and function name.
    let with_id = match &o.id {
        Some(id) => quote!(.with_id(#id)),
        None => quote!(.with_id(#krate::engine::Tool::__id(::core::module_path!(), #fn_name))),
    };
    let background = o.background.map(|_| quote!(.background()));
    let approval = match &o.approval {
        Some((_, None)) => Some(quote!(.needs_approval())),
        Some((_, Some(policy))) => Some(quote!(.approval(#policy))),
        None => None,
    };
    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
    } = f;
    let (docs, other) = split_docs(attrs);
    sig.ident = Ident::new("__body", Span::call_site());
    Ok(quote! {
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        #vis struct #ident;

        impl #ident {
            /// The tool's body.
            #[doc(hidden)]
            #(#other)*
            #vis #sig #block

            /// The tool.
            #vis fn into_tool(self) -> #krate::engine::Tool {
                #krate::engine::define_tool(#tool_name, #desc, #ident::__body)
                #with_id
                #background
                #approval
            }
        }

        impl #krate::engine::IntoTool for #ident {
            fn into_tool(self) -> #krate::engine::Tool {
                #ident::into_tool(self)
            }
        }

        impl #krate::engine::Registrable for #ident {
            fn register_in(
                self,
                registry: &mut #krate::engine::Registry,
            ) -> ::core::result::Result<(), #krate::engine::EngineError> {
                registry.register_tool(self).map(|_| ())
            }
        }
    })
}
