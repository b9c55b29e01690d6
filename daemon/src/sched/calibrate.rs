//! Calibration: a fixed kernel timed on one of this node's lanes, so nodes of one GPU
//! class can be compared (`crate::cluster` records the figure and stops a node whose
//! figure drifts from its class's median). The kernel is the built-in calibration
//! problem's reference, evaluated as a candidate against itself, holding the lane as a
//! job would (nothing else is timed on it meanwhile).

use kiln_types::ProblemSpec;

use super::Scheduler;

/// The calibration problem: y = a + b over 2^20 f32 values, on both backends.
const CALIBRATION_TOML: &str = r#"
name = "kiln-calibration"
summary = "y = a + b over 1,048,576 f32 elements (kiln's node calibration)"
[[tensor]]
name = "a"
dtype = "f32"
shape = [1048576]
role = "input"
[[tensor]]
name = "b"
dtype = "f32"
shape = [1048576]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [1048576]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "calibration.c"
source = "void calibrate(const float *a, const float *b, float *y, int n) { for (int i = 0; i < n; i++) y[i] = a[i] + b[i]; }\n"
launches = [{ kernel = "calibrate", args = ["a", "b", "y", { i32 = 1048576 }] }]
[reference.cuda]
file = "calibration.cu"
source = "extern \"C\" __global__ void calibrate(const float* a, const float* b, float* y, int n) { for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a[i] + b[i]; }\n"
launches = [{ kernel = "calibrate", grid = [4096, 1, 1], block = [256, 1, 1], args = ["a", "b", "y", { i32 = 1048576 }] }]
"#;

impl Scheduler {
    /// Times the calibration kernel on a lane of `backend`; its median, µs.
    pub async fn calibrate(&self, backend: &str) -> Result<f64, String> {
        let problem = ProblemSpec::from_toml(CALIBRATION_TOML)
            .map_err(|e| format!("the calibration problem does not parse: {e}"))?;
        let be = self
            .backends
            .get(backend)
            .cloned()
            .filter(|b| b.status().usable)
            .ok_or_else(|| format!("no usable {backend} backend here"))?;
        let candidate = problem
            .reference_candidate(be.kind())
            .ok_or_else(|| format!("the calibration problem has no {backend} reference"))?;
        let artifact = match self.compile_cached(&be, &problem, &candidate).await {
            Ok(Ok(a)) => a,
            Ok(Err(failure)) => {
                return Err(format!(
                    "the calibration kernel does not compile: {}",
                    failure.message
                ));
            }
            Err(_) => return Err("the calibration kernel could not be compiled".into()),
        };
        let slots = self
            .lane_slots
            .get(backend)
            .cloned()
            .ok_or_else(|| format!("no lanes for {backend}"))?;
        let lane = slots
            .acquire(super::Lanes::Any)
            .await
            .ok_or_else(|| "the lanes are closed".to_string())?;
        let plan = self.plan_for(be.as_ref());
        let index = lane.index;
        let bytes = artifact.bytes.clone();
        let eval = tokio::task::spawn_blocking(move || {
            be.evaluate(index, &problem, &bytes, &candidate, &bytes, &plan)
        })
        .await
        .map_err(|e| format!("calibration task: {e}"))?
        .map_err(|e| format!("calibration: {e}"))?;
        drop(lane);
        match eval.timing {
            Some(t) if eval.verdict == kiln_types::Verdict::Ok && t.median_us > 0.0 => {
                Ok(t.median_us)
            }
            _ => Err(format!(
                "the calibration kernel was not timed: {} ({})",
                eval.verdict, eval.message
            )),
        }
    }
}
