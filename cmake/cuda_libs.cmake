# Finds cuBLAS(Lt), cuDNN 9 and NCCL for the CUDA backend, and stops with a message naming
# every place it looked when CUDA is present but one of them is not. Looked in, in order:
#   1. the CUDA toolkit (${CUDAToolkit_INCLUDE_DIRS}, ${CUDAToolkit_LIBRARY_DIR});
#   2. -DARCLIGHT_CUDA_DEPS=DIR or $ARCLIGHT_CUDA_DEPS, else ~/.cache/arclight/cuda-deps
#      (include/, lib/: what scripts/cuda_deps.sh unpacks from NVIDIA's wheels);
#   3. NVIDIA's pip wheels in every site-packages of python3 (PyTorch's dependencies on a GPU
#      box): nvidia/cu13, nvidia/cublas, nvidia/cudnn, nvidia/nccl, each with include/ and lib/.
# Sets ARCLIGHT_CUDA_LIB_INCLUDES, ARCLIGHT_CUDA_LIBS (full paths) and ARCLIGHT_CUDA_LIB_DIRS.

set(_al_deps "$ENV{ARCLIGHT_CUDA_DEPS}")
if(ARCLIGHT_CUDA_DEPS)
  set(_al_deps "${ARCLIGHT_CUDA_DEPS}")
elseif(NOT _al_deps)
  set(_al_deps "$ENV{HOME}/.cache/arclight/cuda-deps")
endif()
set(_al_roots ${CUDAToolkit_INCLUDE_DIRS}/.. ${CUDAToolkit_LIBRARY_DIR}/.. ${_al_deps})
find_program(_al_python NAMES python3 python)
if(_al_python)
  execute_process(
    COMMAND ${_al_python} -c "import site, sys; print(';'.join(site.getsitepackages() + [site.getusersitepackages()]))"
    OUTPUT_VARIABLE _al_sites OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  foreach(_site ${_al_sites})
    foreach(_pkg cu13 cu12 cublas cudnn nccl)
      if(IS_DIRECTORY ${_site}/nvidia/${_pkg})
        list(APPEND _al_roots ${_site}/nvidia/${_pkg})
      endif()
    endforeach()
  endforeach()
endif()
set(_al_norm)
foreach(_r ${_al_roots})
  get_filename_component(_r "${_r}" ABSOLUTE)
  list(APPEND _al_norm "${_r}")
endforeach()
list(REMOVE_DUPLICATES _al_norm)
set(_al_roots ${_al_norm})
set(_al_incs)
set(_al_libdirs)
foreach(_r ${_al_roots})
  list(APPEND _al_incs ${_r}/include)
  list(APPEND _al_libdirs ${_r}/lib ${_r}/lib64 ${_r}/lib/x86_64-linux-gnu)
endforeach()
list(APPEND _al_incs /usr/include)
list(APPEND _al_libdirs /usr/lib/x86_64-linux-gnu)

set(ARCLIGHT_CUDA_LIB_INCLUDES)
set(ARCLIGHT_CUDA_LIBS)
set(ARCLIGHT_CUDA_LIB_DIRS)
set(_al_missing)
# name | header | library names (versioned sonames: wheels ship no unversioned link)
foreach(_spec "cuBLASLt|cublasLt.h|cublasLt;libcublasLt.so.13;libcublasLt.so.12"
              "cuDNN 9|cudnn.h|cudnn;libcudnn.so.9"
              "NCCL|nccl.h|nccl;libnccl.so.2")
  string(REPLACE "|" ";" _parts "${_spec}")
  list(GET _parts 0 _name)
  list(GET _parts 1 _hdr)
  list(SUBLIST _parts 2 -1 _libs)
  string(MAKE_C_IDENTIFIER "${_name}" _id)
  find_path(AL_${_id}_INCLUDE ${_hdr} PATHS ${_al_incs} NO_DEFAULT_PATH)
  find_library(AL_${_id}_LIBRARY NAMES ${_libs} PATHS ${_al_libdirs} NO_DEFAULT_PATH)
  if(AL_${_id}_INCLUDE AND AL_${_id}_LIBRARY)
    list(APPEND ARCLIGHT_CUDA_LIB_INCLUDES ${AL_${_id}_INCLUDE})
    list(APPEND ARCLIGHT_CUDA_LIBS ${AL_${_id}_LIBRARY})
    get_filename_component(_d ${AL_${_id}_LIBRARY} DIRECTORY)
    list(APPEND ARCLIGHT_CUDA_LIB_DIRS ${_d})
    message(STATUS "arclight: ${_name}: ${AL_${_id}_INCLUDE}/${_hdr}, ${AL_${_id}_LIBRARY}")
  else()
    set(_h "${_hdr} not found")
    set(_l "library not found")
    if(AL_${_id}_INCLUDE)
      set(_h "${AL_${_id}_INCLUDE}/${_hdr}")
    endif()
    if(AL_${_id}_LIBRARY)
      set(_l "${AL_${_id}_LIBRARY}")
    endif()
    list(APPEND _al_missing "${_name}: ${_h}, ${_l}")
  endif()
endforeach()
if(_al_missing)
  list(REMOVE_DUPLICATES _al_incs)
  list(REMOVE_DUPLICATES _al_libdirs)
  string(REPLACE ";" "\n    " _m "${_al_missing}")
  string(REPLACE ";" "\n    " _i "${_al_incs}")
  string(REPLACE ";" "\n    " _l "${_al_libdirs}")
  message(FATAL_ERROR "arclight: CUDA is present (${CMAKE_CUDA_COMPILER}) but the CUDA backend "
    "needs cuBLASLt, cuDNN 9 and NCCL, and these were not found:\n    ${_m}\n"
    "Headers were looked for in:\n    ${_i}\nLibraries in:\n    ${_l}\n"
    "Run scripts/cuda_deps.sh (unpacks NVIDIA's wheels into ~/.cache/arclight/cuda-deps), "
    "pass -DARCLIGHT_CUDA_DEPS=DIR (with include/ and lib/), install PyTorch's nvidia-* wheels, "
    "or configure with -DARCLIGHT_CUDA=OFF.")
endif()
list(REMOVE_DUPLICATES ARCLIGHT_CUDA_LIB_INCLUDES)
list(REMOVE_DUPLICATES ARCLIGHT_CUDA_LIB_DIRS)
