//! What a module's bytes say about its code, read once at load: function
//! names (name section), the code section's offset (DWARF addresses are
//! relative to it) and a lazily built `addr2line` context over its DWARF.

use std::sync::Mutex;

use rustc_hash::FxHashMap;
use wasmparser::{KnownCustom, Name, Parser, Payload};

type Reader = gimli::EndianArcSlice<gimli::LittleEndian>;

/// One resolved source position of a code offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceFrame {
    pub function: String,
    pub file: String,
    pub line: i64,
}

#[derive(Default)]
struct DwarfSections {
    sections: FxHashMap<String, std::sync::Arc<[u8]>>,
}

/// Per-module symbol information.
pub(crate) struct ModuleSymbols {
    names: FxHashMap<u32, String>,
    /// Functions of the sampling allocator itself ([`is_allocator_frame`]).
    allocator: rustc_hash::FxHashSet<u32>,
    code_section_offset: Option<u64>,
    dwarf: DwarfSections,
    context: Mutex<Option<Option<addr2line::Context<Reader>>>>,
    pub has_dwarf: bool,
}

impl std::fmt::Debug for ModuleSymbols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleSymbols")
            .field("names", &self.names.len())
            .field("has_dwarf", &self.has_dwarf)
            .finish()
    }
}

impl ModuleSymbols {
    /// Reads names and DWARF sections; a malformed name section only loses
    /// names (the module itself was already validated by Wasmtime).
    pub fn read(bytes: &[u8]) -> ModuleSymbols {
        let mut names = FxHashMap::default();
        let mut code_section_offset = None;
        let mut dwarf = DwarfSections::default();
        let mut export_names: FxHashMap<u32, String> = FxHashMap::default();
        for payload in Parser::new(0).parse_all(bytes) {
            let Ok(payload) = payload else { break };
            match payload {
                Payload::ExportSection(exports) => {
                    for e in exports.into_iter().flatten() {
                        if e.kind == wasmparser::ExternalKind::Func {
                            export_names
                                .entry(e.index)
                                .or_insert_with(|| e.name.to_string());
                        }
                    }
                }
                Payload::CodeSectionStart { range, .. } => {
                    code_section_offset = Some(range.start as u64);
                }
                Payload::CustomSection(reader) => {
                    if reader.name().starts_with(".debug_") {
                        dwarf
                            .sections
                            .insert(reader.name().to_string(), reader.data().into());
                        continue;
                    }
                    if let KnownCustom::Name(name_reader) = reader.as_known() {
                        for subsection in name_reader {
                            let Ok(Name::Function(map)) = subsection else {
                                continue;
                            };
                            for naming in map.into_iter().flatten() {
                                names.insert(naming.index, demangle(naming.name));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        // Unnamed exported functions are known by their export name.
        for (index, name) in export_names {
            names.entry(index).or_insert(name);
        }
        let has_dwarf = dwarf.sections.contains_key(".debug_info");
        let allocator = names
            .iter()
            .filter(|(_, name)| is_allocator_frame(name))
            .map(|(&index, _)| index)
            .collect();
        ModuleSymbols {
            names,
            allocator,
            code_section_offset,
            dwarf,
            context: Mutex::new(None),
            has_dwarf,
        }
    }

    /// The function's display name: name section (demangled), else its
    /// export name, else
    /// `wasm-function[N]`.
    pub fn function_name(&self, index: u32) -> String {
        self.names
            .get(&index)
            .cloned()
            .unwrap_or_else(|| format!("wasm-function[{index}]"))
    }

    /// Is function `index` part of the guest's sampling allocator?
    pub fn is_allocator(&self, index: u32) -> bool {
        self.allocator.contains(&index)
    }

    /// Source frames for a module offset, innermost (inlined) first; empty
    /// without DWARF or when DWARF does not cover the offset.
    pub fn source_frames(&self, module_offset: u64) -> Vec<SourceFrame> {
        let (Some(code), true) = (self.code_section_offset, self.has_dwarf) else {
            return Vec::new();
        };
        let Some(probe) = module_offset.checked_sub(code) else {
            return Vec::new();
        };
        let mut guard = self.context.lock().unwrap_or_else(|p| p.into_inner());
        let ctx = guard.get_or_insert_with(|| self.build_context());
        let Some(ctx) = ctx.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let unit = ctx.find_dwarf_and_unit(probe).skip_all_loads();
        let Ok(mut frames) = ctx.find_frames(probe).skip_all_loads() else {
            return out;
        };
        while let Ok(Some(frame)) = frames.next() {
            let decl_file = unit
                .zip(frame.dw_die_offset)
                .and_then(|(unit, die)| decl_file(unit, die));
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok().map(|n| demangle(n.as_ref())))
                .unwrap_or_default();
            let (file, line) = frame
                .location
                .as_ref()
                .map(|l| {
                    (
                        l.file.unwrap_or("").to_string(),
                        l.line.map(i64::from).unwrap_or(0),
                    )
                })
                .unwrap_or_default();
            // A function's file is where it is declared. The line-table row
            // can be in another file when code was inlined without an
            // inlined-subroutine entry (rustc does this for some std code);
            // its line numbers mean nothing in the function's own file, so
            // such a frame gets line 0, DWARF's "no source line".
            let (file, line) = match decl_file {
                Some(decl) if decl != file => (decl, 0),
                Some(decl) => (decl, line),
                None => (file, line),
            };
            out.push(SourceFrame {
                function,
                file,
                line,
            });
        }
        out
    }

    fn build_context(&self) -> Option<addr2line::Context<Reader>> {
        let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            let data = self
                .dwarf
                .sections
                .get(id.name())
                .cloned()
                .unwrap_or_else(|| std::sync::Arc::from(&[][..]));
            Ok(gimli::EndianArcSlice::new(data, gimli::LittleEndian))
        };
        let dwarf = gimli::Dwarf::load(load).ok()?;
        addr2line::Context::from_dwarf(dwarf).ok()
    }
}

/// The file a function's DIE (`die`, a subprogram or inlined subroutine)
/// declares it in, following `DW_AT_abstract_origin` and
/// `DW_AT_specification` within the unit; rendered as `addr2line` renders
/// line-table files (comp dir, include directory, name) so the two compare.
fn decl_file(unit: gimli::UnitRef<'_, Reader>, die: gimli::UnitOffset) -> Option<String> {
    let mut offset = die;
    // Origins chain at most a few deep (inlined -> abstract -> declaration);
    // the bound stops a malformed (cyclic) chain.
    for _ in 0..4 {
        let entry = unit.entry(offset).ok()?;
        if let Some(gimli::AttributeValue::FileIndex(index)) =
            entry.attr_value(gimli::DW_AT_decl_file)
        {
            return render_file(unit, index);
        }
        let origin = [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification]
            .into_iter()
            .find_map(|at| match entry.attr_value(at) {
                Some(gimli::AttributeValue::UnitRef(o)) => Some(o),
                _ => None,
            })?;
        offset = origin;
    }
    None
}

fn render_file(unit: gimli::UnitRef<'_, Reader>, index: u64) -> Option<String> {
    use gimli::Reader as _;
    let program = unit.line_program.as_ref()?;
    let header = program.header();
    let file = header.file(index)?;
    let lossy = |value| -> Option<String> {
        Some(
            unit.attr_string(value)
                .ok()?
                .to_string_lossy()
                .ok()?
                .into_owned(),
        )
    };
    let mut path = match &unit.comp_dir {
        Some(dir) => dir.to_string_lossy().ok()?.into_owned(),
        None => String::new(),
    };
    if file.directory_index() != 0
        && let Some(dir) = file.directory(header)
    {
        push_path(&mut path, &lossy(dir)?);
    }
    push_path(&mut path, &lossy(file.path_name())?);
    Some(path)
}

fn push_path(path: &mut String, part: &str) {
    let rooted = |p: &str| p.starts_with(['/', '\\']) || matches!(p.get(1..3), Some(":/" | ":\\"));
    if rooted(part) {
        *path = part.to_string();
        return;
    }
    let sep = if path.starts_with('\\') || path.get(1..3) == Some(":\\") {
        '\\'
    } else {
        '/'
    };
    if !path.is_empty() && !path.ends_with(sep) {
        path.push(sep);
    }
    path.push_str(part);
}

/// The frames a heap sample starts with that are the sampling machinery,
/// not the program: the guest SDK's allocator and the Rust global allocator
/// shims that call it. Heap stacks start below them, at the code that asked
/// for memory, as Go's heap profiles start at the caller of `mallocgc`;
/// otherwise every byte's flat would be the SDK's `on_alloc`.
pub(crate) fn is_allocator_frame(name: &str) -> bool {
    let shim = name.strip_prefix("__rustc::").unwrap_or(name);
    // Only the allocator: the SDK's request entry points (`rt::handle`,
    // `rt::alloc_request`) allocate for the worker and stay.
    name.starts_with("edgeprof_guest_sdk::rt::State::")
        || name.starts_with("<edgeprof_guest_sdk::rt::SamplingAllocator as ")
        || matches!(
            shim,
            "__rust_alloc"
                | "__rust_alloc_zeroed"
                | "__rust_realloc"
                | "__rg_alloc"
                | "__rg_alloc_zeroed"
                | "__rg_realloc"
        )
}

/// Rust symbol names demangled without the hash; other names unchanged.
pub(crate) fn demangle(name: &str) -> String {
    match rustc_demangle::try_demangle(name) {
        Ok(d) => format!("{d:#}"),
        Err(_) => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::is_allocator_frame;

    #[test]
    fn only_the_sampling_allocator_is_cut_from_heap_stacks() {
        for (name, cut) in [
            ("edgeprof_guest_sdk::rt::State::on_alloc", true),
            (
                "<edgeprof_guest_sdk::rt::SamplingAllocator as core::alloc::global::GlobalAlloc>::realloc",
                true,
            ),
            ("__rustc::__rust_alloc", true),
            ("__rust_alloc_zeroed", true),
            ("__rustc::__rust_realloc", true),
            // The SDK's request entry points allocate for the worker.
            ("edgeprof_guest_sdk::rt::handle", false),
            ("edgeprof_guest_sdk::rt::alloc_request", false),
            ("edgeprof_guest_sdk::codec::Response::encode", false),
            ("alloc::alloc::alloc", false),
            ("__rustc::__rust_dealloc", false),
            ("leftover_instrumentation::record_instrumentation", false),
        ] {
            assert_eq!(is_allocator_frame(name), cut, "{name}");
        }
    }
}
