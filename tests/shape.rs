//! The shape of src/ that ARCHITECTURE.md states, held against the code: each module imports only modules on
//! layers below its own (the table under "## Layers"), no module outside `server/` asks which server it is, and
//! no function is longer than `MAX_FUNCTION_LINES`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::visit::Visit;

const MAX_FUNCTION_LINES: usize = 120;

/// The modules of each layer, from ARCHITECTURE.md's table: `| 3 | collect, client |`.
fn layers() -> BTreeMap<String, u32> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("reading ARCHITECTURE.md");
    let section = text
        .split("\n## Layers\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a section `## Layers`");
    let section = section.split("\n## ").next().unwrap();
    let mut layer_of = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, layer, modules, ..] = cells[..] else {
            continue;
        };
        let Ok(layer) = layer.parse::<u32>() else {
            continue;
        };
        for module in modules.split(',') {
            let module = module.trim().trim_matches('`').trim_end_matches('/');
            assert!(
                layer_of.insert(module.to_string(), layer).is_none(),
                "{module} stands on two layers in ARCHITECTURE.md"
            );
        }
    }
    assert!(!layer_of.is_empty(), "no layers read from ARCHITECTURE.md");
    layer_of
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every file of src/ but the crate's roots, with its module (`src/collect/ring.rs` → `collect`).
fn modules() -> Vec<(String, PathBuf, syn::File)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let relative = path.strip_prefix(&src).unwrap().to_owned();
            let module = match relative.components().count() {
                1 => relative.file_stem().unwrap().to_str().unwrap().to_string(),
                _ => relative
                    .iter()
                    .next()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string(),
            };
            if module == "lib" || module == "main" {
                return None;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let file =
                syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", relative.display()));
            Some((module, relative, file))
        })
        .collect()
}

/// What one file imports of the crate (`crate::x…`, in code and in macros' tokens), asks of a flavor, and its
/// long functions.
#[derive(Default)]
struct Reading {
    imports: BTreeSet<String>,
    flavor_checks: Vec<String>,
    long_functions: Vec<(String, usize, usize)>,
}

impl Reading {
    fn use_tree(&mut self, tree: &syn::UseTree, after_crate: bool) {
        match tree {
            syn::UseTree::Path(p) if !after_crate => self.use_tree(&p.tree, p.ident == "crate"),
            syn::UseTree::Path(p) => {
                self.imports.insert(p.ident.to_string());
            }
            syn::UseTree::Name(n) if after_crate => {
                self.imports.insert(n.ident.to_string());
            }
            syn::UseTree::Rename(r) if after_crate => {
                self.imports.insert(r.ident.to_string());
            }
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(t, after_crate)),
            _ => {}
        }
    }

    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let trees: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        for (i, tree) in trees.iter().enumerate() {
            match tree {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Ident(id) if id == "crate" => {
                    if let Some(proc_macro2::TokenTree::Ident(next)) = trees.get(i + 3) {
                        self.imports.insert(next.to_string());
                    }
                }
                _ => {}
            }
        }
    }

    fn function(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        let (start, end) = (span.start().line, span.end().line);
        if end + 1 - start > MAX_FUNCTION_LINES {
            self.long_functions
                .push((name.to_string(), start, end + 1 - start));
        }
    }
}

const FLAVORS: [&str; 4] = ["MariaDb", "MySql", "Percona", "Other"];
const SERVER_NAMES: [&str; 4] = ["MariaDB", "MySQL", "mariadb", "mysql"];

fn names_a_server(expr: &syn::Expr) -> bool {
    matches!(expr, syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) if SERVER_NAMES.contains(&s.value().as_str()))
}

impl<'ast> Visit<'ast> for Reading {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, false);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let names: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if names.len() > 1 && names[0] == "crate" {
            self.imports.insert(names[1].clone());
        }
        for pair in names.windows(2) {
            if pair[0] == "Flavor" && FLAVORS.contains(&pair[1].as_str()) {
                self.flavor_checks.push(pair.join("::"));
            }
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
        let compares = matches!(b.op, syn::BinOp::Eq(_) | syn::BinOp::Ne(_));
        if compares && (names_a_server(&b.left) || names_a_server(&b.right)) {
            self.flavor_checks
                .push("a comparison with a server's name".into());
        }
        syn::visit::visit_expr_binary(self, b);
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        let asks = ["contains", "starts_with", "eq"].contains(&c.method.to_string().as_str());
        if asks && c.args.iter().any(names_a_server) {
            self.flavor_checks
                .push(format!("`.{}` of a server's name", c.method));
        }
        syn::visit::visit_expr_method_call(self, c);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(&f.sig.ident, syn::spanned::Spanned::span(f));
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.function(&f.sig.ident, syn::spanned::Spanned::span(f));
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        self.function(&f.sig.ident, syn::spanned::Spanned::span(f));
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn read(file: &syn::File) -> Reading {
    let mut reading = Reading::default();
    reading.visit_file(file);
    reading
}

#[test]
fn each_module_imports_only_the_layers_below_its_own() {
    let layer_of = layers();
    let mut broken = Vec::new();
    let mut unplaced = BTreeSet::new();
    for (module, path, file) in modules() {
        let Some(&own) = layer_of.get(&module) else {
            unplaced.insert(module);
            continue;
        };
        for import in read(&file).imports {
            if import == module {
                continue;
            }
            match layer_of.get(&import) {
                Some(&layer) if layer < own => {}
                Some(&layer) => broken.push(format!(
                    "{} (layer {own}) imports {import} (layer {layer})",
                    path.display()
                )),
                None => {
                    unplaced.insert(import);
                }
            };
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules on no layer of ARCHITECTURE.md's table: {unplaced:?}"
    );
    assert!(
        broken.is_empty(),
        "imports that break the layers of ARCHITECTURE.md:\n{}",
        broken.join("\n")
    );
}

#[test]
fn only_server_asks_which_server_it_is() {
    let mut found = Vec::new();
    for (module, path, file) in modules() {
        if module != "server" {
            for check in read(&file).flavor_checks {
                found.push(format!("{}: {check}", path.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "what differs between servers belongs in src/server/:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut found = Vec::new();
    for (_, path, file) in modules() {
        for (name, line, lines) in read(&file).long_functions {
            found.push(format!("{}:{line} {name}: {lines} lines", path.display()));
        }
    }
    assert!(
        found.is_empty(),
        "functions of more than {MAX_FUNCTION_LINES} lines:\n{}",
        found.join("\n")
    );
}
