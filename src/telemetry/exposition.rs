//! Prometheus text exposition (format 0.0.4) written by hand for the node's own series: a
//! `# HELP` / `# TYPE` header per family, then its samples, label values escaped.

use std::fmt::Write;

/// A Prometheus text document being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its help text and type (`counter`, `gauge`, `histogram`).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample of the current family (`name` may carry a `_bucket`/`_sum`/`_count` suffix).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", format_value(value));
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The document.
    pub fn finish(self) -> String {
        self.out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_headers_samples_and_escaped_labels() {
        let mut e = Exposition::default();
        e.family("x_total", "counter", "an x");
        e.sample("x_total", &[("job", "a\"b")], 3.0);
        e.single("y", "gauge", "a y", 0.5);
        assert_eq!(
            e.finish(),
            "# HELP x_total an x\n# TYPE x_total counter\nx_total{job=\"a\\\"b\"} 3\n\
             # HELP y a y\n# TYPE y gauge\ny 0.5\n"
        );
    }
}
