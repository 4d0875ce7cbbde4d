//! What a dynamically linked exec file needs in its root to start: its ELF interpreter and
//! the shared libraries it and they name (DT_NEEDED), found where the dynamic loader looks.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use goblin::container::{Container, Ctx, Endian};
use goblin::elf::dynamic::{self, Dynamic};
use goblin::elf::program_header::{self, ProgramHeader};
use goblin::elf::{header, Elf};
use goblin::strtab::Strtab;
use thiserror::Error;

/// Errors finding an exec file's libraries.
#[derive(Debug, Error)]
pub enum LibrariesError {
    /// A file could not be read.
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    /// A file is no ELF object.
    #[error("{0} is no ELF file: {1}")]
    Parse(PathBuf, #[source] goblin::error::Error),
    /// A needed library is in none of the directories searched.
    #[error("{object} needs {library}, found in none of {dirs:?}")]
    NotFound {
        /// The object that names it.
        object: PathBuf,
        /// The library's name.
        library: String,
        /// Where it was looked for.
        dirs: Vec<PathBuf>,
    },
}

/// The directories the dynamic loader searches after an object's own run path, as Debian's
/// multiarch glibc has them, then those of /etc/ld.so.conf.d.
const SYSTEM_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// The files `exec` needs besides itself to start (its interpreter and libraries, as the
/// paths the loader will open), none for a static binary.
pub fn needed_by(exec: &Path) -> Result<Vec<PathBuf>, LibrariesError> {
    let mut needed = BTreeSet::new();
    let mut pending = vec![exec.to_owned()];
    let system = system_dirs();
    while let Some(object) = pending.pop() {
        let linking = Linking::read(&object)?;
        if let Some(interpreter) = linking.interpreter {
            let interpreter = PathBuf::from(interpreter);
            if needed.insert(interpreter.clone()) {
                pending.push(interpreter);
            }
        }
        let own: Vec<PathBuf> = linking
            .run_paths
            .iter()
            .flat_map(|paths| paths.split(':'))
            .filter(|dir| dir.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        for library in &linking.libraries {
            let dirs: Vec<PathBuf> = own.iter().chain(&system).cloned().collect();
            let found = dirs
                .iter()
                .map(|dir| dir.join(library))
                .find(|path| path.is_file())
                .ok_or_else(|| LibrariesError::NotFound {
                    object: object.clone(),
                    library: library.clone(),
                    dirs: dirs.clone(),
                })?;
            if needed.insert(found.clone()) {
                pending.push(found);
            }
        }
    }
    Ok(needed.into_iter().collect())
}

/// What an ELF object says of its dynamic linking.
struct Linking {
    interpreter: Option<String>,
    libraries: Vec<String>,
    /// DT_RUNPATH and DT_RPATH, each a list separated by colons.
    run_paths: Vec<String>,
}

/// The first bytes of an object read at once: its header and program headers, and in
/// practice its interpreter's name and dynamic section.
const PREFIX: usize = 64 << 10;

/// Reads `file` from its start up to at least `len` bytes (or its end) into `data`.
fn read_to(file: &mut fs::File, data: &mut Vec<u8>, len: usize) -> std::io::Result<()> {
    if data.len() < len {
        let have = data.len();
        file.by_ref().take((len - have) as u64).read_to_end(data)?;
    }
    Ok(())
}

impl Linking {
    /// Reads the program headers and the dynamic section only, and only as far into the file
    /// as they lie: a VMM with its debug lines is tens of MiB, which would take tens of
    /// milliseconds to read for every VM started.
    fn read(path: &Path) -> Result<Self, LibrariesError> {
        let read_error = |e| LibrariesError::Read(path.to_owned(), e);
        let parse_error = |e| LibrariesError::Parse(path.to_owned(), e);
        let mut file = fs::File::open(path).map_err(read_error)?;
        let mut data = Vec::new();
        read_to(&mut file, &mut data, PREFIX).map_err(read_error)?;
        let header = Elf::parse_header(&data).map_err(parse_error)?;
        let container = match header.e_ident[header::EI_CLASS] == header::ELFCLASS64 {
            true => Container::Big,
            false => Container::Little,
        };
        let little = header.e_ident[header::EI_DATA] == header::ELFDATA2LSB;
        let ctx = Ctx::new(container, Endian::from(little));
        let table_end =
            header.e_phoff as usize + header.e_phnum as usize * header.e_phentsize as usize;
        read_to(&mut file, &mut data, table_end).map_err(read_error)?;
        let headers =
            ProgramHeader::parse(&data, header.e_phoff as usize, header.e_phnum as usize, ctx)
                .map_err(parse_error)?;
        let wanted = |kind| {
            headers
                .iter()
                .find(move |h: &&ProgramHeader| h.p_type == kind && h.p_filesz > 0)
        };
        let (interp, dynamic) = (
            wanted(program_header::PT_INTERP),
            wanted(program_header::PT_DYNAMIC),
        );
        let end = [interp, dynamic]
            .into_iter()
            .flatten()
            .map(|h| (h.p_offset + h.p_filesz) as usize)
            .max()
            .unwrap_or(0);
        read_to(&mut file, &mut data, end).map_err(read_error)?;
        let interpreter = interp.and_then(|h| {
            let start = h.p_offset as usize;
            let bytes = data.get(start..start + h.p_filesz as usize - 1)?;
            std::str::from_utf8(bytes).ok().map(str::to_owned)
        });
        let mut linking = Linking {
            interpreter,
            libraries: Vec::new(),
            run_paths: Vec::new(),
        };
        let Some(dynamic) = Dynamic::parse(&data, &headers, ctx).map_err(parse_error)? else {
            return Ok(linking);
        };
        let (strtab, strsz) = (dynamic.info.strtab, dynamic.info.strsz);
        read_to(&mut file, &mut data, strtab + strsz).map_err(read_error)?;
        let strings = Strtab::parse(&data, strtab, strsz, 0).map_err(parse_error)?;
        linking.libraries = dynamic
            .get_libraries(&strings)
            .into_iter()
            .map(str::to_owned)
            .collect();
        linking.run_paths = dynamic
            .dyns
            .iter()
            .filter(|d| d.d_tag == dynamic::DT_RUNPATH || d.d_tag == dynamic::DT_RPATH)
            .filter_map(|d| strings.get_at(d.d_val as usize))
            .map(str::to_owned)
            .collect();
        Ok(linking)
    }
}

/// [`SYSTEM_DIRS`], then the absolute directories listed in /etc/ld.so.conf.d/*.conf.
fn system_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
    let Ok(entries) = fs::read_dir("/etc/ld.so.conf.d") else {
        return dirs;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    for file in files {
        let text = fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().map(str::trim) {
            if line.starts_with('/') && !dirs.iter().any(|d| d == Path::new(line)) {
                dirs.push(PathBuf::from(line));
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_needs_its_loader_and_libc() {
        let needed = needed_by(&std::env::current_exe().unwrap()).unwrap();
        let names: Vec<String> = needed
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("ld-linux")),
            "{needed:?}"
        );
        assert!(names.iter().any(|n| n == "libc.so.6"), "{needed:?}");
        assert!(needed.iter().all(|p| p.is_absolute() && p.is_file()));
    }

    #[test]
    fn a_file_that_is_no_elf_is_an_error() {
        let text = std::env::temp_dir().join(format!("vmm-jailer-no-elf-{}", std::process::id()));
        fs::write(&text, "not an ELF file").unwrap();
        let err = needed_by(&text).unwrap_err();
        fs::remove_file(&text).unwrap();
        assert!(matches!(err, LibrariesError::Parse(..)), "{err}");
    }
}
